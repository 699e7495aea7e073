"""docs/security.md's ACL tables are generated from ``connectors.kafka.access.ROLES``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connectors.kafka.access import ROLES, docs_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_s_table_is_the_declaration(role: str) -> None:
    text = DOC.read_text()
    found = re.search(rf"<!-- acls: {re.escape(role)} \(.*?-->\n(.*?)\n<!-- end of acls -->",
                      text, re.S)
    assert found, f"docs/security.md has no table for role {role!r}"
    assert found.group(1) == docs_table(role), f"regenerate the {role!r} table from ROLES"


def test_no_table_for_an_undeclared_role() -> None:
    assert set(re.findall(r"<!-- acls: (\S+) ", DOC.read_text())) == set(ROLES)
