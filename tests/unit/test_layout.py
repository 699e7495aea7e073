"""The package's layout rules (docs/architecture.md), checked on the source text.

- Spark only in ``connectors/spark/``: nothing under ``connectors/core`` or a family
  (``kafka``, ``jdbc``, ``files``) imports ``pyspark`` or ``connectors.spark``, not even
  lazily inside a function or through ``importlib``.
  Nor do they reach into a DataFrame's JVM (``_jdf``, ``_jvm``, ``sparkContext``,
  ``rdd``), which a Spark Connect session does not have.
- No module under ``connectors/`` is longer than 500 lines, and no function longer than 80.
- The Kafka source and sink never import each other: nothing under
  ``connectors/kafka/source/`` imports ``connectors.kafka.sink``, nor the other way round,
  not even lazily; what they share is ``connectors/kafka/common.py``.
- No import circles among the modules under ``connectors/``, counting imports inside
  functions and under ``TYPE_CHECKING``; the circles known when the check came are listed in
  ``ALLOWED_CIRCLES`` for their owners, and leave it with the circle.
- No family imports the CLI, and no JDBC module imports the JDBC protocol (``jdbc/sink.py``)
  back: the sink and the staging strategies share ``jdbc/database.py`` instead.
"""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "connectors")
SPARK_FREE = ("core", "kafka", "jdbc", "files")
FORBIDDEN = ("pyspark", "connectors.spark")
JVM_ATTRIBUTES = {"_jdf", "_jvm", "_jsc", "sparkContext", "rdd"}
MAX_LINES = 500


def modules(*subdirs: str) -> list[str]:
    roots = [os.path.join(PACKAGE, d) for d in subdirs] if subdirs else [PACKAGE]
    out = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            out.extend(os.path.join(dirpath, f) for f in files if f.endswith(".py"))
    return sorted(out)


def imported_names(path: str, package_dir: str = PACKAGE) -> list[tuple[int, str]]:
    """Every module a file imports anywhere: import statements at any depth (relative ones
    resolved), and string arguments of ``importlib.import_module`` / ``__import__``."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = os.path.relpath(os.path.dirname(path), os.path.dirname(package_dir)).split(os.sep)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("path", modules(*SPARK_FREE),
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_core_and_families_never_import_spark(path: str) -> None:
    bad = [f"line {n}: {name}" for n, name in imported_names(path) if _forbidden(name)]
    assert not bad, f"{os.path.relpath(path, PACKAGE)} imports Spark: {bad}"


@pytest.mark.parametrize("path", modules(*SPARK_FREE),
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_core_and_families_never_reach_into_the_jvm(path: str) -> None:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    bad = [f"line {n.lineno}: .{n.attr}" for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and n.attr in JVM_ATTRIBUTES]
    assert not bad, f"{os.path.relpath(path, PACKAGE)} uses Spark's JVM objects: {bad}"


KAFKA_SIDES = {"source": "connectors.kafka.sink", "sink": "connectors.kafka.source"}


def _imports(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


@pytest.mark.parametrize("path", [p for side in KAFKA_SIDES for p in modules(f"kafka/{side}")],
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_kafka_source_and_sink_never_import_each_other(path: str) -> None:
    side = os.path.relpath(path, os.path.join(PACKAGE, "kafka")).split(os.sep)[0]
    other = KAFKA_SIDES[side]
    bad = [f"line {n}: {name}" for n, name in imported_names(path) if _imports(name, other)]
    assert not bad, (f"{os.path.relpath(path, PACKAGE)} imports {other}: {bad}; move what "
                     "the source and the sink share into connectors/kafka/common.py")


def test_both_kafka_sides_are_checked() -> None:
    for side in KAFKA_SIDES:
        assert modules(f"kafka/{side}"), f"connectors/kafka/{side}/ has no modules"


def test_the_import_check_sees_lazy_and_relative_imports(tmp_path) -> None:
    sample = tmp_path / "connectors" / "jdbc" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "def f():\n    from pyspark import TaskContext\n"
        "def g():\n    from ..spark import sink_adapter\n"
        "def h():\n    import importlib\n    importlib.import_module('connectors.spark.x')\n"
    )
    found = imported_names(str(sample), str(tmp_path / "connectors"))
    names = [name for _, name in found if _forbidden(name)]
    assert names == ["pyspark", "pyspark.TaskContext", "connectors.spark",
                     "connectors.spark.sink_adapter", "connectors.spark.x"]


def test_no_module_is_longer_than_500_lines() -> None:
    long = {}
    for path in modules():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[os.path.relpath(path, PACKAGE)] = n
    assert not long, f"modules above {MAX_LINES} lines: {long}"


#: The longest a function or method may be, docstring included: one that does not fit a
#: screen and a half holds more than one step (split it where its steps part).
MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in modules():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, PACKAGE)}:{node.lineno} {node.name} "
                                f"({n} lines)")
    assert not long, f"functions above {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", modules(*SPARK_FREE),
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_families_never_import_the_cli(path: str) -> None:
    bad = [f"line {n}: {name}" for n, name in imported_names(path)
           if name == "connectors.cli" or name.startswith("connectors.cli.")
           or name == "connectors.__main__"]
    assert not bad, f"{os.path.relpath(path, PACKAGE)} imports the CLI: {bad}"


@pytest.mark.parametrize("path", [p for p in modules("jdbc") if not p.endswith("sink.py")],
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_jdbc_engines_never_import_the_protocol(path: str) -> None:
    """``jdbc/sink.py`` (the protocol) sits on top of its family: a module it uses that
    imported it back (as staging.py once did, for the dialect and connections) would make
    a circle; such a module takes ``connectors.jdbc.database.Database`` instead."""
    bad = [f"line {n}: {name}" for n, name in imported_names(path)
           if name == "connectors.jdbc.sink" or name.startswith("connectors.jdbc.sink.")]
    assert not bad, f"{os.path.relpath(path, PACKAGE)} imports connectors.jdbc.sink: {bad}"


# -- no import circles --------------------------------------------------------------------------
#: Circles that were there when the check came (issue 45), left to their owners: each entry is
#: the set of modules of one circle. A circle that grows, shrinks or goes away fails the test
#: too, so that its entry leaves with it.
ALLOWED_CIRCLES: tuple[frozenset[str], ...] = ()


def module_name(path: str, package_dir: str = PACKAGE) -> str:
    parts = os.path.relpath(path, os.path.dirname(package_dir))[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: str = PACKAGE) -> dict[str, set[str]]:
    """Each module under ``package_dir`` -> the modules there it imports, at the top or
    inside a function (:func:`imported_names`). ``from pkg import name`` is an import of
    ``pkg.name`` when that is a module (a compiled one counts as outside), else of ``pkg``."""
    paths = {module_name(p, package_dir): p for p in modules_under(package_dir)}

    def compiled(package: str, leaf: str) -> bool:
        path = paths[package]
        return path.endswith("__init__.py") and any(
            f.split(".")[0] == leaf and not f.endswith(".py")
            for f in os.listdir(os.path.dirname(path)))

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        statements: dict[int, list[str]] = {}
        for line, imported in imported_names(path, package_dir):
            statements.setdefault(line, []).append(imported)
        targets: set[str] = set()
        for names in statements.values():
            found, submodules = set(), set()
            for imported in names:
                parent, _, leaf = imported.rpartition(".")
                if imported in paths:
                    found.add(imported)
                elif parent in paths and compiled(parent, leaf):
                    submodules.add(imported)
                elif parent in paths:
                    found.add(parent)
            every = found | submodules
            # `from pkg import mod` runs pkg/__init__.py only as the parent of mod
            targets |= {m for m in found if not any(o.startswith(m + ".") for o in every)}
        graph[name] = targets - {name}
    return graph


def modules_under(package_dir: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(package_dir)
                  for f in files if f.endswith(".py"))


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def loop(graph: dict[str, set[str]], circle: set[str]) -> str:
    """One loop through a circle, ``a -> b -> a``, for the message."""
    start = min(circle)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & circle):
            if w == start:
                return " -> ".join([*paths[v], start])
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return ", ".join(sorted(circle))


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    new = [loop(graph, c) for c in found if frozenset(c) not in ALLOWED_CIRCLES]
    assert not new, ("modules under connectors/ that import each other (at the top or in a "
                     "function): " + "; ".join(new) + ". Move what both need into a module "
                     "below them, so that the imports point one way")
    gone = [sorted(c) for c in ALLOWED_CIRCLES if c not in {frozenset(f) for f in found}]
    assert not gone, f"allowed circles no longer there: remove them from ALLOWED_CIRCLES: {gone}"


def test_the_circle_check_sees_every_kind_of_import(tmp_path) -> None:
    root = tmp_path / "connectors"
    (root / "fam").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "fam" / "__init__.py").write_text("def run():\n    from connectors.fam import c\n")
    (root / "fam" / "a.py").write_text("from connectors.fam import b\n")
    (root / "fam" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    (root / "fam" / "c.py").write_text("from connectors.fam import run\n")
    (root / "fam" / "d.py").write_text("from connectors.fam import _native, a\n")
    (root / "fam" / "_native.c").write_text("")
    graph = import_graph(str(root))
    assert graph["connectors.fam.d"] == {"connectors.fam.a"}  # not the package, not C
    found = sorted(sorted(c) for c in circles(graph))
    assert found == [["connectors.fam", "connectors.fam.c"],
                     ["connectors.fam.a", "connectors.fam.b"]]
    assert loop(graph, set(found[1])) == "connectors.fam.a -> connectors.fam.b -> connectors.fam.a"
