"""The arithmetic of bench/endurance.py: growth per 1,000 batches after warm-up, cut at
restarts, and the verdicts and limits ``--check`` fails on (no Spark, no services)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


@pytest.fixture(scope="module")
def endurance():
    sys.path.insert(0, os.path.abspath(BENCH))
    spec = importlib.util.spec_from_file_location("endurance", os.path.join(BENCH,
                                                                            "endurance.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["endurance"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def samples(values):
    return [{"x": x, "fds": y} for x, y in values]


def test_a_leak_of_one_per_batch_is_a_thousand_per_thousand(endurance):
    run = samples((x, 40 + x) for x in range(0, 2000, 50))
    parts = endurance.stretches(run, [], warmup=300, settle=100)
    assert endurance.growth(parts, "fds") == pytest.approx(1000)


def test_warm_up_is_left_out(endurance):
    """A start-up climb in the first batches is no growth."""
    run = samples((x, min(x, 200)) for x in range(0, 2000, 50))
    parts = endurance.stretches(run, [], warmup=300, settle=100)
    assert endurance.growth(parts, "fds") == pytest.approx(0)


def test_a_restart_is_a_new_level_not_growth(endurance):
    """A driver restart drops the process series to a new level; each stretch keeps its own
    level, so a flat series stays flat and a leak keeps its slope across the cut."""
    flat = samples([(x, 100) for x in range(0, 1000, 50)] + [(x, 60) for x in
                                                              range(1000, 2000, 50)])
    parts = endurance.stretches(flat, [1000], warmup=200, settle=100)
    assert len(parts) == 2 and all(p[0]["x"] >= 200 for p in parts)
    assert parts[1][0]["x"] >= 1100
    assert endurance.growth(parts, "fds") == pytest.approx(0)
    leak = samples([(x, x / 10) for x in range(0, 1000, 50)]
                   + [(x, (x - 1000) / 10) for x in range(1000, 2000, 50)])
    parts = endurance.stretches(leak, [1000], warmup=200, settle=100)
    assert endurance.growth(parts, "fds") == pytest.approx(100)


def test_too_few_samples_is_unmeasured_and_check_says_so(endurance):
    run = samples([(0, 1), (400, 2)])
    parts = endurance.stretches(run, [], warmup=300, settle=100)
    assert endurance.growth(parts, "fds") is None
    s = endurance.BY_KEY["driver_fds"]
    assert endurance.verdict(s, None, []) == "not measured"
    failures = endurance.check_failures([(s, None, None, None)], 0, [], 0, 0, True, [])
    assert any("too few samples" in f for f in failures)


def test_check_fails_on_growth_retention_exactness_and_terminations(endurance):
    fds = endurance.BY_KEY["driver_fds"]
    meta = endurance.BY_KEY["spark_metadata_kb"]  # grows with the output: never a failure
    rows = [(fds, 950.0, 40, 990), (meta, 500.0, 1, 100)]
    limit = endurance.retention_limits()["rk_wal_files"]
    over = [{"x": 1500, "rk_wal_files": limit + 1}]
    failures = endurance.check_failures(rows, 200, over, 1, 0, False, [])
    assert any("driver open files grew 190.0 over the 200 batches" in f for f in failures)
    assert not any("_spark_metadata KB" in f for f in failures)
    assert any("more than the retention allows" in f for f in failures)
    assert "an output is not exact" in failures
    assert any("query terminations" in f for f in failures)
    clean = endurance.check_failures([(fds, 10.0, 40, 41)], 200, [{"x": 1, "rk_wal_files": 3}],
                                     0, 0, True, [])
    assert clean == []


def test_every_series_has_a_bound_and_the_ci_ones_a_tolerance(endurance):
    for s in endurance.SERIES:
        assert s.bound and s.label
        assert s.ci is None or s.tolerance is not None, s.key
    assert len({s.key for s in endurance.SERIES}) == len(endurance.SERIES)


def test_verdicts_shrinking_is_flat_a_cap_is_a_bound_the_output_grows(endurance):
    fds = endurance.BY_KEY["driver_fds"]
    assert endurance.verdict(fds, -40.0, []) == "flat"  # a sawtooth's slope may be negative
    assert endurance.verdict(fds, fds.tolerance + 1, []) == "GROWS"
    jvm = endurance.BY_KEY["jvm_rss_mb"]
    cap = endurance.DRIVER_HEAP_MB + endurance.JVM_OVERHEAD_MB
    assert endurance.verdict(jvm, 300.0, [{"jvm_rss_mb": cap - 1}]).startswith("within")
    assert endurance.verdict(jvm, 0.0, [{"jvm_rss_mb": cap + 1}]).startswith("PAST ITS BOUND")
    spool = endurance.BY_KEY["spool_kb"]
    run = [{"spool_files": 3, "spool_kb": 4000.0}]
    assert endurance.verdict(spool, 3000.0, run).startswith("within")
    assert endurance.verdict(endurance.BY_KEY["data_files"], 1000.0, []) == \
        "grows with the output"
    assert endurance.verdict(endurance.BY_KEY["workers_rss_mb"], 500.0, []) == "-"
