"""tests/schedule.py: the parallel phase's longest-first order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import schedule


@dataclass
class _Marker:
    args: tuple[str, ...]
    kwargs: dict[str, str] = field(default_factory=dict)


@dataclass
class _Item:
    nodeid: str
    group: str | None = None

    def get_closest_marker(self, name: str) -> Any:
        assert name == "xdist_group"
        return _Marker((self.group,)) if self.group else None


def _ids(items: list[_Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_modules_move_as_blocks_weighed_by_their_longest_test() -> None:
    items = [_Item("a.py::short1"), _Item("a.py::short2"), _Item("b.py::one_long"),
             _Item("b.py::tiny"), _Item("c.py::mid")]
    seconds = {"a.py::short1": 10, "a.py::short2": 10, "b.py::one_long": 200,
               "b.py::tiny": 1, "c.py::mid": 50}
    schedule.longest_first(items, seconds)
    # b first (its 200-s test), its tests in their order; a's 20 s in all weigh 10
    assert _ids(items) == ["b.py::one_long", "b.py::tiny", "c.py::mid", "a.py::short1",
                           "a.py::short2"]


def test_a_group_is_one_piece_weighed_by_its_sum() -> None:
    items = [_Item("x.py::solo"), _Item("g/m1.py::t1", "grp"), _Item("g/m2.py::t2", "grp")]
    seconds = {"x.py::solo": 100, "g/m1.py::t1": 60, "g/m2.py::t2": 60}
    schedule.longest_first(items, seconds)
    assert _ids(items) == ["g/m1.py::t1", "g/m2.py::t2", "x.py::solo"]


def test_unknown_tests_weigh_a_typical_test_and_ties_keep_collection_order() -> None:
    items = [_Item("n.py::new"), _Item("k.py::known"), _Item("m.py::same")]
    seconds = {"k.py::known": 5.0, "m.py::same": schedule.UNKNOWN}
    schedule.longest_first(items, seconds)
    assert _ids(items) == ["n.py::new", "m.py::same", "k.py::known"]


def test_without_durations_collection_order_stands(tmp_path: Path) -> None:
    items = [_Item("b.py::t"), _Item("a.py::t")]
    schedule.longest_first(items, schedule.load(tmp_path / "missing.json"))
    assert _ids(items) == ["b.py::t", "a.py::t"]


def test_from_junit_names_tests_as_pytest_does(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.integration.test_x" name="test_a[p-1]" time="12.34"/>'
        '<testcase classname="tests.integration.cluster.test_y" name="test_b@spark-cluster"'
        ' time="3"/></testsuite></testsuites>')
    assert schedule.from_junit(report) == {
        "tests/integration/cluster/test_y.py::test_b": 3.0,
        "tests/integration/test_x.py::test_a[p-1]": 12.3,
    }


def test_the_durations_file_names_integration_tests_by_node_id() -> None:
    seconds = schedule.load()
    assert len(seconds) > 100
    for nodeid in seconds:
        path, _, name = nodeid.partition("::")
        assert path.startswith("tests/integration/") and path.endswith(".py") and name, nodeid
