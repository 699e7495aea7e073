"""docs/monitoring.md and the Grafana dashboard name only metrics the code exports, and the
page lists every one of them (issue 44, item 6)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from connectors.monitoring import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "eo-connectors.json"
PAGE = REPO / "docs" / "monitoring.md"
NAME = re.compile(r"\beo_[a-z0-9_]+")


def exported() -> set[str]:
    """Every metric family name and every sample name (``_total``, ``_bucket``...)."""
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
    # families without samples yet (no label set touched) still have their suffixed names
    for family in metrics.REGISTRY.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
    return names


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def alert_exprs() -> list[str]:
    block = PAGE.read_text().split("```yaml", 1)[1].split("```", 1)[0]
    return [line.split("expr:", 1)[1].strip() for line in block.splitlines() if "expr:" in line]


def test_every_dashboard_query_names_an_exported_metric() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    names = exported()
    for expr in exprs:
        used = NAME.findall(expr)
        assert used, f"dashboard query names no eo_ metric: {expr}"
        assert set(used) <= names, f"{expr}: {set(used) - names} not exported"


def test_every_alert_names_an_exported_metric() -> None:
    exprs = alert_exprs()
    assert len(exprs) >= 5
    names = exported()
    for expr in exprs:
        used = NAME.findall(expr)
        assert used and set(used) <= names, f"{expr}: {set(used) - names} not exported"


def test_the_page_lists_every_exported_metric_and_no_other() -> None:
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in metrics.REGISTRY.collect()}
    listed = set(re.findall(r"^\| `(eo_[a-z0-9_]+)` \|", PAGE.read_text(), re.M))
    assert listed == families
