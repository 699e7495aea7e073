"""The parallel phase's order: the longest work first (tests/README.md, "Time budget").

pytest-xdist hands each worker the next test in collection order (``--dist loadgroup``: a
test at a time, an ``xdist_group`` as one piece). In collection order the slowest modules
came last, so one worker ran the last four minutes of recovery tests while the other waited:
the phase's end waited on whichever long test came last. Ordered longest first, the last
pieces are short ones and the two workers end within seconds of each other (the longest
processing time rule).

``tests/durations.json`` holds the seconds each test took in a CI run; a module moves as one
block, so its module-scoped fixtures still start once a worker. A block's weight is its
longest piece: the longest test of a module, the whole of a group. A test the file does not
name counts :data:`UNKNOWN` seconds. Refresh the file from a CI run's report:

    python -m tests.schedule /tmp/tmp.XXXX/parallel.xml
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

DURATIONS = Path(__file__).parent / "durations.json"
#: The weight of a test the durations file does not name (a new test): a typical one.
UNKNOWN = 30.0


def load(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds by test id, as pytest names it (``tests/integration/test_soak.py::
    test_broker_connection_loss_recovers_exactly``); empty if the file is missing or
    unreadable (then collection order stands)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in doc.items()}


def _block(item: Any) -> str:
    group = item.get_closest_marker("xdist_group")
    if group is not None:
        return "group:" + str(group.args[0] if group.args else group.kwargs.get("name"))
    return "module:" + item.nodeid.split("::", 1)[0]


def longest_first(items: list[Any], seconds: dict[str, float]) -> None:
    """Reorder ``items`` in place: blocks (a module, or an xdist group) by their longest
    piece, longest first; items keep their order within a block."""
    if not seconds:
        return
    blocks: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        blocks[_block(item)].append(item)

    def weight(name: str) -> float:
        each = [seconds.get(i.nodeid, UNKNOWN) for i in blocks[name]]
        return sum(each) if name.startswith("group:") else max(each)

    order = sorted(blocks, key=weight, reverse=True)  # stable: ties keep collection order
    items[:] = [item for name in order for item in blocks[name]]


def from_junit(report: Path) -> dict[str, float]:
    """Seconds by test id from a pytest JUnit report (xdist's ``@group`` suffix dropped)."""
    out: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - our own report
        module, name = case.get("classname", ""), case.get("name", "")
        name = re.sub(r"@[\w.-]+$", "", name)
        out[module.replace(".", "/") + ".py::" + name] = round(float(case.get("time", 0)), 1)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    found = from_junit(Path(sys.argv[1]))
    DURATIONS.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    print(f"{DURATIONS}: {len(found)} tests, {sum(found.values()) / 60:.1f} test-minutes")
