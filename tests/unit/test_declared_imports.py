"""Every third-party module the code, the tests and the benchmarks import is declared in
``pyproject.toml`` (issue 41): a package installed by hand on one machine once let the
clean-clone CI pass while ``pip install -e ".[dev]"`` on a new machine failed the suite
(``jsonschema``, which confluent-kafka's ``json`` extra brings, was declared nowhere).

Two checks, so the next missing one fails in seconds, on any machine:

- **declared**: the distribution that provides each imported module is named in the
  project's requirements (``connectors/``: the dependencies or an extra, since optional
  formats import theirs lazily; ``tests/`` and ``bench/``: the dependencies or the ``dev``
  extra), or in the requirements those bring transitively, with extras and markers as pip
  evaluates them. This holds whatever else the machine has installed;
- **importable**: each such module can be found in this interpreter, which under
  ``.ci/run`` is a virtualenv made new for the run from those declarations alone.

Imports are read from the source text at any depth (inside functions too), with
``importlib.import_module``/``__import__`` string arguments; standard-library modules and
the repository's own modules (``connectors``, ``tests``, ``bench``, a script's sibling
module) are left out.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import tomli
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomli.loads((REPO / "pyproject.toml").read_text())
OWN = {"connectors", "tests", "bench"}


def imports_of(path: Path) -> set[str]:
    """Top-level module names a file imports anywhere in it (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            value = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(value, str):
                found.add(value)
    return found


def third_party(path: Path) -> set[str]:
    """The imported names of ``path`` that are neither the standard library nor ours (a
    module of the repository, or a sibling module next to a script, as bench/ has)."""
    out = set()
    for name in imports_of(path):
        top = name.split(".")[0]
        if not top or top in sys.stdlib_module_names or top in OWN:
            continue
        if (path.parent / f"{top}.py").exists() or (path.parent / top).is_dir():
            continue
        if re.fullmatch(r".*_pb2(_grpc)?", top):
            continue  # message classes protoc generates at test time
        out.add(name)
    return out


def _files(root: str) -> list[Path]:
    return sorted(p for p in (REPO / root).rglob("*.py") if "egg-info" not in str(p))


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def _applies(req: Requirement, extra: str) -> bool:
    if req.marker is None:
        return True
    return bool(req.marker.evaluate({"extra": extra}))


@cache
def closure(extras: tuple[str, ...]) -> frozenset[str]:
    """The distributions the project's requirements with ``extras`` bring, transitively,
    as pip resolves them (each requirement's own extras followed, markers evaluated)."""
    seen: set[tuple[str, str]] = set()
    todo = [(canonicalize_name(r.name), e) for r in _requirements(extras)
            for e in ("", *sorted(r.extras))]
    while todo:
        dist, extra = todo.pop()
        if (dist, extra) in seen:
            continue
        seen.add((dist, extra))
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue  # not installed: the importable check names it
        for text in requires:
            req = Requirement(text)
            if _applies(req, extra):
                name = canonicalize_name(req.name)
                todo += [(name, e) for e in ("", *sorted(req.extras))]
    return frozenset(d for d, _ in seen)


@cache
def _providers() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions providing it. Python 3.10's
    ``packages_distributions`` reads only ``top_level.txt``, which wheels built by hatchling
    (jsonschema) or maturin do not write; the files they installed say it too, as 3.11+
    reads them."""
    found: dict[str, set[str]] = {}
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        tops = (dist.read_text("top_level.txt") or "").split()
        if not tops:
            tops = [f.parts[0] if len(f.parts) > 1 else f.name.split(".")[0]
                    for f in dist.files or () if f.suffix in (".py", ".so", ".pyi")
                    and not f.parts[0].startswith("..")]
        for top in tops:
            found.setdefault(top, set()).add(name)
    return {k: sorted(v) for k, v in found.items()}


def providers(module: str) -> list[str]:
    """The installed distributions that provide a module ([] when none is installed)."""
    return _providers().get(module.split(".")[0], [])


def _undeclared(roots: tuple[str, ...], extras: tuple[str, ...]) -> list[str]:
    allowed = closure(extras)
    bad = []
    for root in roots:
        for path in _files(root):
            for name in sorted(third_party(path)):
                dists = providers(name)
                if dists and not set(dists) & allowed:
                    bad.append(f"{path.relative_to(REPO)}: {name} (from {', '.join(dists)})")
    return bad


def test_the_package_imports_only_declared_distributions() -> None:
    extras = tuple(sorted(PYPROJECT["project"]["optional-dependencies"]))
    bad = _undeclared(("connectors",), extras)
    assert not bad, ("imported but declared in no requirement of pyproject.toml (the "
                     "dependencies or an extra):\n" + "\n".join(bad))


def test_tests_and_benchmarks_import_only_what_the_dev_extra_brings() -> None:
    bad = _undeclared(("tests", "bench", "scripts"), ("dev",))
    assert not bad, ("imported but not brought by pyproject.toml's dependencies or its dev "
                     "extra:\n" + "\n".join(bad))


@pytest.mark.parametrize("root", ["connectors", "tests", "bench", "scripts"])
def test_every_third_party_import_is_installed(root: str) -> None:
    missing = sorted({name for path in _files(root) for name in third_party(path)
                      if importlib.util.find_spec(name.split(".")[0]) is None})
    assert not missing, (f"imported under {root}/ but not installed here: {missing}; "
                         'pip install -e ".[dev]" must bring each of them')


def test_the_check_sees_a_removed_dev_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: with jsonschema and confluent-kafka's json extra taken out of the
    dev extra, the JSON Schema tests' import of ``jsonschema`` is reported undeclared."""
    project = PYPROJECT["project"]
    dev = [r for r in project["optional-dependencies"]["dev"]
           if canonicalize_name(Requirement(r).name) != "jsonschema"
           and "json" not in Requirement(r).extras]
    monkeypatch.setitem(project["optional-dependencies"], "dev", dev)
    closure.cache_clear()
    try:
        bad = _undeclared(("tests",), ("dev",))
    finally:
        closure.cache_clear()
    assert any(": jsonschema " in line for line in bad), bad


def test_markers_are_evaluated_as_pip_does() -> None:
    assert _applies(Requirement('x; extra == "json"'), "json")
    assert not _applies(Requirement('x; extra == "json"'), "")
    assert Marker('python_version >= "3"').evaluate({"extra": ""})
