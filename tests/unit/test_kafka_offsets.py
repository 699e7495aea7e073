"""Offset arithmetic of the eo_kafka source: JSON offsets, ranges, splitting, rate limits."""

from __future__ import annotations

import itertools
import random

import pytest

from connectors.core.errors import KafkaSourceError, OptionError
from connectors.kafka.source.offsets import (
    OffsetRange,
    clamp_offsets,
    decode_offsets,
    encode_offsets,
    group_ranges,
    limit_offsets,
    parse_partition_offsets,
    plan_ranges,
    records_for_bytes,
    split_ranges,
    total_records,
)

T = "topic"


def tp(p: int, topic: str = T, cluster: str = "") -> tuple[str, str, int]:
    return (cluster, topic, p)


# -- JSON offsets ------------------------------------------------------------------------------
def test_parse_json_offsets_with_earliest_and_latest() -> None:
    got = parse_partition_offsets('{"a": {"0": 23, "1": -2}, "b": {"0": -1}}', "startingOffsets")
    assert got == {("a", 0): 23, ("a", 1): -2, ("b", 0): -1}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("not json", "not valid JSON"),
        ("[]", "non-empty JSON object"),
        ("{}", "non-empty JSON object"),
        ('{"a": 5}', "no partition object"),
        ('{"a": {"x": 1}}', "non-numeric partition"),
        ('{"a": {"-1": 1}}', "negative partition"),
        ('{"a": {"0": "5"}}', "non-integer value"),
        ('{"a": {"0": 1.5}}', "non-integer value"),
        ('{"a": {"0": true}}', "non-integer value"),
        ('{"a": {"0": -3}}', "invalid offset -3"),
    ],
)
def test_parse_json_offsets_errors_name_the_option(text: str, fragment: str) -> None:
    with pytest.raises(OptionError) as e:
        parse_partition_offsets(text, "startingOffsets")
    assert fragment in str(e.value)
    assert "startingOffsets" in str(e.value)
    assert e.value.option == "startingOffsets"


def test_parse_json_ending_offsets_refuses_earliest() -> None:
    with pytest.raises(OptionError, match="-2"):
        parse_partition_offsets('{"a": {"0": -2}}', "endingOffsets", allow_earliest=False)
    assert parse_partition_offsets('{"a": {"0": -1}}', "endingOffsets", allow_earliest=False) == {
        ("a", 0): -1
    }


def test_parse_timestamps_refuse_negative() -> None:
    assert parse_partition_offsets('{"a": {"0": 17}}', "x", timestamps=True) == {("a", 0): 17}
    with pytest.raises(OptionError, match="negative timestamp"):
        parse_partition_offsets('{"a": {"0": -1}}', "x", timestamps=True)


@pytest.mark.parametrize("multi", [False, True])
def test_encode_decode_round_trip(multi: bool) -> None:
    cluster = "east" if multi else ""
    offsets = {tp(0, cluster=cluster): 5, tp(10, cluster=cluster): 7, ("" if not multi else "west",
                                                                          "b", 1): 0}
    obj = encode_offsets(offsets, multi)
    assert decode_offsets(obj, multi) == offsets
    if not multi:
        # Spark's own shape: topic -> partition (string) -> next offset.
        assert obj == {T: {"0": 5, "10": 7}, "b": {"1": 0}}
    else:
        assert obj == {"east": {T: {"0": 5, "10": 7}}, "west": {"b": {"1": 0}}}


def test_decode_rejects_bad_shape() -> None:
    with pytest.raises(KafkaSourceError):
        decode_offsets({"t": 5}, False)


# -- ranges --------------------------------------------------------------------------------------
def test_plan_ranges_new_partition_starts_at_zero_and_empty_ranges_are_dropped() -> None:
    start = {tp(0): 10, tp(1): 4}
    end = {tp(0): 20, tp(1): 4, tp(2): 3}
    assert plan_ranges(start, end, fail_on_data_loss=True) == [
        OffsetRange("", T, 0, 10, 20),
        OffsetRange("", T, 2, 0, 3, new_partition=True),
    ]


def test_plan_ranges_end_below_start_is_data_loss() -> None:
    with pytest.raises(KafkaSourceError, match=r"topic-0.*below the start offset 50"):
        plan_ranges({tp(0): 50}, {tp(0): 20}, fail_on_data_loss=True)


def test_plan_ranges_end_below_start_skipped_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    got = plan_ranges({tp(0): 50, tp(1): 0}, {tp(0): 20, tp(1): 5}, fail_on_data_loss=False)
    assert got == [OffsetRange("", T, 1, 0, 5)]
    assert "data loss" in caplog.text and "topic-0" in caplog.text


def test_split_min_partitions_exact_and_covering() -> None:
    ranges = [OffsetRange("", T, 0, 0, 5000), OffsetRange("", T, 1, 100, 5100)]
    out = split_ranges(ranges, min_partitions=8)
    assert len(out) == 8
    assert sum(r.size for r in out) == 10000
    _assert_covers(ranges, out)


def test_split_min_partitions_proportional_to_size() -> None:
    ranges = [OffsetRange("", T, 0, 0, 9000), OffsetRange("", T, 1, 0, 1000)]
    out = split_ranges(ranges, min_partitions=10)
    assert len(out) == 10
    assert sum(1 for r in out if r.partition == 0) == 9
    _assert_covers(ranges, out)


def test_split_never_makes_empty_pieces() -> None:
    ranges = [OffsetRange("", T, 0, 0, 2), OffsetRange("", T, 1, 0, 1)]
    out = split_ranges(ranges, min_partitions=10)
    assert all(r.size > 0 for r in out)
    assert sum(r.size for r in out) == 3
    assert len(out) == 3


def test_split_max_records_per_partition() -> None:
    ranges = [OffsetRange("", T, 0, 0, 2500), OffsetRange("", T, 1, 0, 10)]
    out = split_ranges(ranges, max_records_per_partition=1000)
    assert [r.size for r in out if r.partition == 0] == [833, 833, 834]
    assert all(r.size <= 1000 for r in out)
    _assert_covers(ranges, out)


# -- grouping small ranges (many partitions) --------------------------------------------------
def test_group_many_small_partitions_into_few_spark_partitions() -> None:
    ranges = [OffsetRange("", T, p, 0, 1000) for p in range(1000)]
    groups = group_ranges(ranges, 100_000)
    assert len(groups) == 10
    assert [len(g) for g in groups] == [100] * 10
    assert [r for g in groups for r in g] == sorted(ranges)  # in order, each range once


def test_group_keeps_large_ranges_alone() -> None:
    big = [OffsetRange("", T, p, 0, 250_000) for p in range(4)]
    small = [OffsetRange("", T, p, 0, 10) for p in range(4, 8)]
    groups = group_ranges(big + small, 100_000)
    assert groups == [(r,) for r in big] + [tuple(small)]
    assert group_ranges(big + small, 0) == [(r,) for r in sorted(big + small)]  # off


def test_group_respects_max_records_and_min_partitions() -> None:
    ranges = [OffsetRange("", T, p, 0, 100) for p in range(100)]
    groups = group_ranges(ranges, 100_000, max_records=1000)
    assert len(groups) == 10 and all(sum(r.size for r in g) <= 1000 for g in groups)
    assert len(group_ranges(ranges, 100_000, min_groups=7)) >= 7
    # minPartitions split these; grouping must not undo it
    pieces = split_ranges([OffsetRange("", T, 0, 0, 5), OffsetRange("", T, 1, 0, 5),
                           OffsetRange("", T, 2, 0, 90)], min_partitions=4)
    assert len(group_ranges(pieces, 100_000, min_groups=4)) >= 4


def test_a_group_has_one_cluster_and_distinct_partitions() -> None:
    ranges = [OffsetRange(c, T, p, 0, 10) for c in ("east", "west") for p in range(3)]
    ranges += [OffsetRange("east", T, 0, 10, 20)]  # a second piece of east/topic-0
    for g in group_ranges(ranges, 100_000):
        assert len({r.cluster for r in g}) == 1
        assert len({r.tp for r in g}) == len(g)
    assert sum(len(g) for g in group_ranges(ranges, 100_000)) == len(ranges)


def test_grouping_is_pure_and_covers_every_offset() -> None:
    rng = random.Random(11)
    for _ in range(200):
        ranges = [
            OffsetRange(rng.choice(["", "x"]), f"t{rng.randint(0, 2)}", p, s,
                        s + rng.randint(0, 5000))
            for p, s in enumerate(rng.randint(0, 10**6) for _ in range(rng.randint(1, 40)))
        ]
        min_p = rng.choice([None, 1, 3, 8, 50])
        max_r = rng.choice([None, 7, 300, 10**6])
        target = rng.choice([0, 1, 500, 3000, 100_000])
        pieces = split_ranges(ranges, min_p, max_r)
        a = group_ranges(pieces, target, min_groups=min_p, max_records=max_r)
        b = group_ranges(list(reversed(pieces)), target, min_groups=min_p, max_records=max_r)
        assert a == b
        _assert_covers(ranges, [r for g in a for r in g])
        for g in a:
            if len(g) > 1:
                assert sum(r.size for r in g) <= min(target, max_r or target)
        if min_p is not None and len(pieces) >= min_p:
            assert len(a) >= min_p


def test_split_is_pure_and_deterministic() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ranges = [
            OffsetRange("", f"t{rng.randint(0, 2)}", p, s, s + rng.randint(0, 5000))
            for p, s in enumerate(rng.randint(0, 10**6) for _ in range(rng.randint(1, 6)))
        ]
        kwargs = {"min_partitions": rng.choice([None, 1, 3, 8, 50]),
                  "max_records_per_partition": rng.choice([None, 7, 300, 10**6])}
        a = split_ranges(ranges, **kwargs)
        b = split_ranges(list(reversed(ranges)), **kwargs)  # input order does not matter
        assert a == b
        _assert_covers(ranges, a)


def _assert_covers(ranges: list[OffsetRange], pieces: list[OffsetRange]) -> None:
    """Pieces tile each non-empty range exactly: no gap, no overlap."""
    for r in ranges:
        mine = sorted((p.start, p.end) for p in pieces if p.tp == r.tp)
        if r.size == 0:
            assert mine == []
            continue
        assert mine[0][0] == r.start and mine[-1][1] == r.end
        for (_, e), (s, _) in itertools.pairwise(mine):
            assert e == s


# -- rate limits ---------------------------------------------------------------------------------
def test_limit_proportional_to_backlog() -> None:
    start = {tp(0): 0, tp(1): 0, tp(2): 0}
    latest = {tp(0): 6000, tp(1): 3000, tp(2): 1000}
    end = limit_offsets(start, latest, 1000)
    assert total_records(start, end) == 1000
    assert end == {tp(0): 600, tp(1): 300, tp(2): 100}


def test_limit_budget_larger_than_backlog_reads_everything() -> None:
    start = {tp(0): 5, tp(1): 0}
    latest = {tp(0): 10, tp(1): 3}
    assert limit_offsets(start, latest, 1000) == latest


def test_limit_never_exceeds_budget_and_is_deterministic() -> None:
    rng = random.Random(3)
    for _ in range(500):
        n = rng.randint(1, 8)
        start = {tp(p): rng.randint(0, 100) for p in range(n)}
        latest = {k: v + rng.choice([0, 1, 2, 17, 999, 10**5]) for k, v in start.items()}
        budget = rng.randint(0, 3000)
        end = limit_offsets(start, latest, budget)
        backlog = total_records(start, latest)
        assert total_records(start, end) == min(budget, backlog)
        assert all(start[k] <= end[k] <= latest[k] for k in start)
        assert limit_offsets(dict(reversed(start.items())), latest, budget) == end


def test_limit_small_partition_not_starved() -> None:
    start = {tp(0): 0, tp(1): 0}
    latest = {tp(0): 10**9, tp(1): 1}
    end = limit_offsets(start, latest, 1000)
    assert end[tp(1)] == 1
    assert total_records(start, end) == 1000


def test_limit_budget_below_partition_count_favours_largest_backlogs() -> None:
    start = {tp(p): 0 for p in range(4)}
    latest = {tp(0): 5, tp(1): 50, tp(2): 500, tp(3): 50}
    end = limit_offsets(start, latest, 2)
    assert end == {tp(0): 0, tp(1): 1, tp(2): 1, tp(3): 0}


def test_limit_new_partition_counts_from_start_given() -> None:
    # The planner passes a new partition's earliest offset as its start.
    end = limit_offsets({tp(0): 0, tp(1): 100}, {tp(0): 100, tp(1): 200}, 10)
    assert end == {tp(0): 5, tp(1): 105}


def test_clamp_and_bytes() -> None:
    assert clamp_offsets({tp(0): 10, tp(1): 5}, {tp(0): 7}) == {tp(0): 7}
    assert records_for_bytes(10_000, 100.0) == 100
    assert records_for_bytes(10, 1000.0) == 1
    assert records_for_bytes(10_000, 0.0) == 10_000


@pytest.mark.parametrize("code", ["_UNKNOWN_PARTITION", "_TIMED_OUT", "_AUTHENTICATION"])
def test_a_stalled_read_reads_on_while_the_watermarks_are_not_known(code: str) -> None:
    """librdkafka's cache missing the partition for a moment (after an election under node
    kills), or a timeout, is no news about the log: the read goes on, bounded by the stall
    deadline. An authentication failure is news, and fails the task."""
    from confluent_kafka import KafkaError, KafkaException

    from connectors.kafka.source.offsets import OffsetRange, stalled

    class Consumer:
        def get_watermark_offsets(self, *_: object, **__: object) -> tuple[int, int]:
            raise KafkaException(KafkaError(getattr(KafkaError, code)))

    r = OffsetRange("", "t", 0, 10, 20)
    if code == "_AUTHENTICATION":
        with pytest.raises(KafkaException):
            stalled(Consumer(), r, 12, True, 1.0)
    else:
        assert stalled(Consumer(), r, 12, True, 1.0) is None
