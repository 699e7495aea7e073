"""docs/design.md and the code say the same steps: every step marker in a protocol module
(``# 2b.``, ``# 3T.``) appears in that protocol's section of docs/design.md, and no other
module numbers steps (the sink contract and the adapter's steps have names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()
MARKER = re.compile(r"^\s*# (\d+[a-zA-Z]?)\.(?:\s|$)", re.M)

#: protocol module -> the heading of its section in docs/design.md
SECTIONS = {
    "connectors/kafka/source/planner.py": "## Kafka source",
    "connectors/kafka/sink/sink.py": "## Kafka sink: recovery keys",
    "connectors/kafka/sink/writer.py": "## Kafka sink: recovery keys",
    "connectors/kafka/sink/recovery_key_mode.py": "## Kafka sink: recovery keys",
    "connectors/kafka/sink/transactional_mode.py": "## Kafka sink: transactional path",
    "connectors/jdbc/sink.py": "## JDBC sink",
    "connectors/jdbc/database.py": "## JDBC sink",
    "connectors/jdbc/scopes.py": "## JDBC sink",
    "connectors/files/sink.py": "## File sink",
}


def section(heading: str) -> str:
    start = DESIGN.index(heading)
    nxt = DESIGN.find("\n## ", start + len(heading))
    return DESIGN[start: nxt if nxt >= 0 else len(DESIGN)]


@pytest.mark.parametrize("module", sorted(SECTIONS))
def test_every_step_marker_of_a_protocol_is_in_its_design_section(module: str) -> None:
    markers = set(MARKER.findall((ROOT / module).read_text()))
    assert markers, f"{module} has no step markers"
    text = section(SECTIONS[module])
    for m in sorted(markers):
        listed = re.search(rf"(^|\n)\s*(- )?(\*\*)?{re.escape(m)}\.(\*\*)?\s", text)
        assert listed, f"step {m}. of {module} is not listed under {SECTIONS[module]!r}"


def test_only_protocol_modules_number_their_steps() -> None:
    numbered = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "connectors").rglob("*.py")
        if MARKER.search(p.read_text()))
    assert set(numbered) <= set(SECTIONS), set(numbered) - set(SECTIONS)


def test_the_failpoints_named_in_code_are_in_the_design() -> None:
    names = set()
    for p in (ROOT / "connectors").rglob("*.py"):
        names |= set(re.findall(r"\"((?:kafka_sink|kafka_source|jdbc|files)\.[a-z_]+)\"",
                                p.read_text()))
    missing = sorted(n for n in names if f"`{n}`" not in DESIGN)
    assert not missing, f"failpoints not described in docs/design.md: {missing}"
