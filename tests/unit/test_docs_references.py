"""Every file and section the repository's prose refers to exists (issue 36, item 9; issue 41).

The docs drifted once: the code cited numbered sections of a direction file that is not in
the repository, which a reader cannot open, and a table said object stores are refused
after they were supported. The prose checked here is every ``.md`` file of the repository,
and the docstrings, comments and prose strings (messages, help texts: a string with a space
in it) of the code under ``connectors/``, ``tests/``, ``bench/``, ``scripts/`` and ``.ci/``
(Python, C, shell, the Maven poms):

- links such as ``[the JDBC protocol](docs/design.md#jdbc-sink)``: the file exists, and the
  anchor is a heading of it (GitHub's slugs: lower case, punctuation dropped, spaces as
  hyphens);
- repository paths, in backquotes or not (``connectors/...``, ``docs/...``, ``tests/...``,
  ``bench/...``, ``scripts/...``): they exist (a glob matches, ``module.Symbol`` names a
  module that exists); a bare file name in backquotes (``ordering.py``) names a file
  somewhere in the repository;
- every ``.md`` file named is a file of the repository, found beside the citing file, at the
  root or in ``docs/``. A file outside the repository fails, wherever it is, unless another
  project's name owns it (``librdkafka's CONFIGURATION.md``);
- sections named in words, ``docs/design.md, "The wire client's failures"`` or
  ``kafka-sink.md "Throughput"``: that file has a heading, or a paragraph, that starts so;
- numbered sections, ``docs/deploying.md section 3``: the file has a heading numbered so.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: directories that are not the repository's own (tools' caches, virtualenvs, build output)
SKIPPED = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build",
           "dist", "node_modules", "spark-warehouse", "metastore_db", "demo-output"}
ROOTS = ("connectors", "docs", "tests", "bench", "scripts", ".ci")
#: where code is read for citations
CODE_ROOTS = ("connectors", "tests", "bench", "scripts", ".ci")


def _repository_files() -> list[Path]:
    out = []
    for top, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not d.startswith(".venv")
                   and not d.endswith(".egg-info") and Path(top, d) != REPO / "bench" / "out"]
        out += [Path(top, n) for n in names]
    return sorted(out)


FILES = _repository_files()
BASENAMES = {p.name for p in FILES}
DOCS = [p for p in FILES if p.suffix == ".md"]


def _is_shell(path: Path) -> bool:
    if path.suffix == ".sh":
        return True
    with path.open("rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and b"sh" in first


CODE = [p for p in FILES if p.relative_to(REPO).parts[0] in CODE_ROOTS
        and (p.suffix in (".py", ".c", ".xml") or (not p.suffix and _is_shell(p)))]
#: this module: its strings are samples of bad citations, the checks' test data; only its
#: docstrings and comments are read
SELF = Path(__file__).resolve()


def _strip_fences(text: str) -> str:
    """Markdown without fenced code blocks (a ``#`` comment there is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@functools.cache
def _prose(path: Path) -> str:
    return _strip_fences(path.read_text())


def _comment_runs(lines: list[tuple[int, str]]) -> Iterator[str]:
    """Comments on consecutive lines, as one text (a citation may wrap)."""
    run: list[str] = []
    last = -2
    for number, text in lines:
        if number != last + 1 and run:
            yield "\n".join(run)
            run = []
        run.append(text)
        last = number
    if run:
        yield "\n".join(run)


def _python_texts(path: Path, strings: bool = True) -> Iterator[str]:
    """Docstrings and comments, and with ``strings`` the other prose strings (messages, help
    texts): a string without a space is a name or a pattern (a file's name, a regex)."""
    source = path.read_text()
    tree = ast.parse(source)
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Constant)] if strings else \
        [n.value for n in ast.walk(tree) if isinstance(n, ast.Expr)
         and isinstance(n.value, ast.Constant)]
    for node in nodes:
        if isinstance(node.value, str) and re.search(r"\s", node.value.strip()):
            yield node.value
    yield from _comment_runs([(t.start[0], t.string.lstrip("#:").strip())
                              for t in tokenize.generate_tokens(io.StringIO(source).readline)
                              if t.type == tokenize.COMMENT])


@functools.cache
def _texts(path: Path) -> list[str]:
    """The prose of a file: a markdown file whole (fenced blocks too: a command in a block
    names a real script), else its comments (and Python's strings)."""
    text = path.read_text()
    if path.suffix == ".md":
        return [text]
    if path.suffix == ".py":
        return list(_python_texts(path, strings=path != SELF))
    if path.suffix == ".c":
        return [re.sub(r"^\s*\*+ ?", "", c, flags=re.M)
                for c in re.findall(r"/\*.*?\*/|//[^\n]*", text, re.S)]
    if path.suffix == ".xml":
        return re.findall(r"<!--(.*?)-->", text, re.S)
    comments = [(n, m.group(1)) for n, line in enumerate(text.splitlines())
                if (m := re.search(r"(?:^|\s)#(?!!)(.*)$", line))]
    return list(_comment_runs(comments))


@functools.cache
def _headings(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} +(.+)$", _prose(path), re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in _headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


@functools.cache
def _sections(path: Path) -> list[str]:
    """Headings, and paragraphs (their first line: a labelled paragraph such as "Row order
    (`ordering.py`). A row's seq ...")."""
    paragraphs = re.findall(r"(?:\A|\n\n)(?!#)\**([^\n]+)", _prose(path))
    return _headings(path) + [p.strip("*") for p in paragraphs]


def _plain(heading: str) -> str:
    return heading.replace("`", "").strip().lower()


def _resolve(doc: Path, target: str) -> Path | None:
    """The repository's file that ``target`` names from ``doc``: beside it, at the root or in
    docs/. A file outside the repository is no answer, even where it exists."""
    for base in (doc.parent, REPO, REPO / "docs"):
        path = (base / target).resolve()
        if path.exists() and path.is_relative_to(REPO):
            return path
    return None


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def bad_links(doc: Path, text: str) -> list[str]:
    bad = []
    for target in re.findall(r"\]\(([^)\s\[\]^?*+\\'\"`]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = doc if not file else _resolve(doc, file)
        if path is None:
            bad.append(f"{target}: no file {file}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            bad.append(f"{target}: {_rel(path)} has no heading #{anchor}")
    return bad


def _exists(token: str) -> bool:
    token = re.split(r"::|:\d", token)[0].rstrip(".,;:)")
    if any(c in token for c in "*?["):
        return any(REPO.glob(token))
    if (REPO / token).exists():
        return True
    # connectors/kafka/common.ClientCache: a module and a name in it
    module, _, _ = token.rpartition(".")
    return bool(module) and (REPO / f"{module}.py").exists()


def bad_paths(doc: Path, text: str) -> list[str]:
    roots = "|".join(re.escape(r) for r in ROOTS)
    paths = set(re.findall(rf"(?<![\w/.~<${{-])((?:{roots})/[\w./*?\[\]-]*\w[\w.*]*)", text))
    bad = sorted(p for p in paths if not _exists(p))
    names = set(re.findall(r"`([\w-]+\.(?:py|md|c|toml|xml|yaml|cfg))`", text))
    bad += sorted(f"{n} (no file of that name)" for n in names if n not in BASENAMES)
    return bad


#: projects whose documents the prose may name by file (``librdkafka's CONFIGURATION.md``)
OTHER_PROJECTS = ("librdkafka",)


def _without_urls(text: str) -> str:
    """The text without addresses, links to them and other projects' documents."""
    text = re.sub(r"\[[^\]]*\]\([a-z]+://[^)]*\)", "", text)
    text = re.sub(r"\b[a-z]+://\S+", "", text)
    owners = "|".join(OTHER_PROJECTS)
    return re.sub(rf"\b(?:{owners})'s [\w.-]+\.md\b", "", text)


#: a markdown file named in prose; ``*.md`` (a glob) and ``.md`` (a suffix) are not names
MD_NAME = re.compile(r"(?<![\w./*-])((?:\.\./|\./)*[\w-][\w./-]*\.md)(?![\w-])")
QUOTED = r"(?:\"([^\"]+)\"|“([^”]+)”|'([^']+)')"
IN_WORDS = re.compile(rf"([\w./-]+\.md)`*,? {QUOTED}")
NUMBERED = re.compile(r"([\w./-]+\.md)`*(?:'s)?,? (?:sections?|s\.|§) ?(\d+\w?)")


def bad_sections(doc: Path, text: str) -> list[str]:
    text = " ".join(_without_urls(text).split())
    bad = []
    for file in sorted(set(MD_NAME.findall(text))):
        if _resolve(doc, file) is None:
            bad.append(f"{file}: no such file in the repository")
    for file, *quoted in IN_WORDS.findall(text):
        heading = next(q for q in quoted if q)
        path = _resolve(doc, file)
        if path is not None and not any(
                _plain(h).startswith(_plain(heading)) for h in _sections(path)):
            bad.append(f'{file}, "{heading}": no such heading in {_rel(path)}')
    for file, number in NUMBERED.findall(text):
        path = _resolve(doc, file)
        if path is None or not any(re.match(rf"{number}\b", h) for h in _headings(path)):
            bad.append(f"{file} section {number}: no such file or numbered section")
    return bad


def _check(paths: list[Path], check: str) -> None:
    find = {"links": bad_links, "paths": bad_paths, "sections": bad_sections}[check]
    bad = [f"{_rel(p)}: {b}" for p in paths for text in _texts(p) for b in find(p, text)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_link_and_its_anchor_exists(doc: Path) -> None:
    bad = bad_links(doc, _prose(doc))
    assert not bad, bad


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_repository_path_exists(doc: Path) -> None:
    _check([doc], "paths")


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_file_and_section_named_in_words_exists(doc: Path) -> None:
    _check([doc], "sections")


@pytest.mark.parametrize("root", CODE_ROOTS)
@pytest.mark.parametrize("check", ["links", "paths", "sections"])
def test_every_citation_in_the_code_exists(root: str, check: str) -> None:
    _check([p for p in CODE if p.relative_to(REPO).parts[0] == root], check)


def test_the_slugs_are_github_s() -> None:
    assert slug("2b. Object stores: S3, GCS, Azure Blob") == "2b-object-stores-s3-gcs-azure-blob"
    assert slug("`transactional=true`") == "transactionaltrue"
    assert slug("Into 1,000 partitions") == "into-1000-partitions"
    assert slug("Kafka sink: transactional path (`transactional=true`)") == \
        "kafka-sink-transactional-path-transactionaltrue"


def test_a_citation_in_code_is_read_and_a_file_outside_is_refused(tmp_path: Path) -> None:
    """The checks read a citation wrapped over comment lines or in a docstring, and refuse a
    file outside the repository however it is cited."""
    code = tmp_path / "cited.py"
    code.write_text('"""The sink (``docs/design.md``, "JDBC sink")."""\n'
                    "x = 1  # as docs/design.md,\n"
                    '# "No such heading" says\n')
    texts = _texts(code)
    assert [b for t in texts for b in bad_sections(code, t)] == \
        ['docs/design.md, "No such heading": no such heading in docs/design.md']
    design = REPO / "docs" / "design.md"
    assert bad_sections(design, 'docs/design.md, "JDBC sink" and kafka-sink.md "Throughput"') \
        == []
    assert bad_sections(design, "docs/deploying.md section 3") == []
    assert bad_sections(design, "docs/deploying.md section 9")
    for outside in ("DESIGN.md section 10", "(DESIGN.md s. 6)", "the rule is DESIGN.md's",
                    'DESIGN.md section 6, "Producer"', "../shared/DESIGN.md",
                    "../../shared/DESIGN.md"):
        assert bad_sections(design, outside), outside
    assert bad_sections(design, "see https://example.org/CONFIGURATION.md, or docs/*.md") == []
    assert bad_sections(design, "librdkafka's [CONFIGURATION.md](https://example.org/C.md)") \
        == []
    assert bad_sections(design, "librdkafka's CONFIGURATION.md and the team's DESIGN.md") == \
        ["DESIGN.md: no such file in the repository"]
