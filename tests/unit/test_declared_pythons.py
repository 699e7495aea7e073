"""The Pythons and pyspark versions pyproject.toml declares are the ones the release check
installs on (issue 50): the classifiers run without a gap from ``requires-python``'s lower
bound, and scripts/release_check.py reads its lowest and highest Python and its lowest
pyspark from them."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import tomli
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomli.loads((REPO / "pyproject.toml").read_text())["project"]


def release_check():
    spec = importlib.util.spec_from_file_location("release_check",
                                                  REPO / "scripts" / "release_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release_check"] = module
    spec.loader.exec_module(module)
    return module


def test_the_classifiers_run_from_requires_python_without_a_gap() -> None:
    pythons, pyspark = release_check().declared()
    minors = [int(v.split(".")[1]) for v in pythons]
    assert minors == list(range(minors[0], minors[-1] + 1)), pythons
    bound = re.fullmatch(r">=(3\.\d+)", PROJECT["requires-python"])
    assert bound is not None and pythons[0] == bound.group(1)
    assert not SpecifierSet(PROJECT["requires-python"]).contains(f"3.{minors[0] - 1}")
    assert pyspark == "4.2"

