"""The integration suite's costly tiers run on one pytest-xdist worker each
(tests/conftest.py XDIST_GROUPS): one Spark cluster and one Kafka cluster per run, not one per
worker. Grouping has failed silently twice (the conftest hook ran after xdist's, and pytest
9.2's node ids drop xdist's group suffix), so this runs a small suite through the same
conftest hook on two workers and checks where each test ran."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import XDIST_GROUPS

HOOK = Path(__file__).resolve().parents[1] / "conftest.py"


def test_each_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from tests import schedule\n"  # the hook orders the items too, longest first
        f"XDIST_GROUPS = {XDIST_GROUPS!r}\n"
        + _hook_source()
    )
    for part in XDIST_GROUPS:
        d = tmp_path / part.strip("/")
        d.mkdir(parents=True)
        (d / f"test_{d.name.replace('-', '_')}.py").write_text(
            "import os, pytest\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            "def test_where(i, request):\n"
            "    with open(os.environ['WHERE'], 'a') as f:\n"
            "        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + request.node.nodeid"
            " + '\\n')\n"
        )
    where = tmp_path / "where.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={"WHERE": str(where), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(HOOK.parents[1])},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in where.read_text().splitlines():
        worker, nodeid = line.split(" ", 1)
        group = next(g for p, g in XDIST_GROUPS.items() if p.strip("/") in nodeid)
        workers[group].add(worker)
    assert set(workers) == set(XDIST_GROUPS.values())
    assert all(len(w) == 1 for w in workers.values()), dict(workers)


def _hook_source() -> str:
    """The conftest's grouping hook, as it is written there."""
    text = HOOK.read_text()
    start = text.index("@pytest.hookimpl(tryfirst=True)")
    end = text.index("\n\n\n", start)
    return text[start:end] + "\n"
