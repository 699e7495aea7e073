"""Every file and section the README and docs/ refer to exists (issue 36, item 9): the docs
drifted once ("DESIGN.md section 10", a file and a numbering that are not in the repository;
a table saying object stores are refused after they were supported). Checked here:

- links ``[text](path#anchor)``: the file exists, and the anchor is a heading of it (GitHub's
  slugs: lower case, punctuation dropped, spaces as hyphens);
- repository paths, in backquotes or not (``connectors/...``, ``docs/...``, ``tests/...``,
  ``bench/...``, ``scripts/...``): they exist (a glob matches, ``module.Symbol`` names a
  module that exists); a bare ``name.py`` names a file somewhere in the repository;
- sections named in words, ``docs/design.md, "The wire client's failures"`` or
  ``kafka-sink.md "Throughput"``: that file has a heading, or a paragraph, that starts so;
- ``FILE.md section N``: the file exists and has a heading numbered N.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
ROOTS = ("connectors", "docs", "tests", "bench", "scripts", ".ci")
FILES = [p for p in REPO.rglob("*") if p.is_file() and ".git" not in p.parts
         and "egg-info" not in str(p)]
BASENAMES = {p.name for p in FILES}


def _prose(path: Path) -> str:
    """The text without fenced code blocks (a ``#`` comment there is not a heading)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def _headings(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} +(.+)$", _prose(path), re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in _headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def _sections(path: Path) -> list[str]:
    """Headings, and paragraphs (their first line: a labelled paragraph such as "Row order
    (`ordering.py`). A row's seq ...")."""
    paragraphs = re.findall(r"(?:\A|\n\n)(?!#)\**([^\n]+)", _prose(path))
    return _headings(path) + [p.strip("*") for p in paragraphs]


def _plain(heading: str) -> str:
    return heading.replace("`", "").strip().lower()


def _resolve(doc: Path, target: str) -> Path | None:
    for base in (doc.parent, REPO, REPO / "docs"):
        if (base / target).exists():
            return (base / target).resolve()
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_its_anchor_exists(doc: Path) -> None:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = doc if not file else _resolve(doc, file)
        if path is None:
            bad.append(f"{target}: no file {file}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            bad.append(f"{target}: {path.relative_to(REPO)} has no heading #{anchor}")
    assert not bad, bad


def _exists(token: str) -> bool:
    token = re.split(r"::|:\d", token)[0].rstrip(".,;:)")
    if any(c in token for c in "*?["):
        return any(REPO.glob(token))
    if (REPO / token).exists():
        return True
    # connectors/kafka/common.ClientCache: a module and a name in it
    module, _, _ = token.rpartition(".")
    return bool(module) and (REPO / f"{module}.py").exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_exists(doc: Path) -> None:
    text = doc.read_text()
    roots = "|".join(re.escape(r) for r in ROOTS)
    paths = set(re.findall(rf"(?<![\w/.~<-])((?:{roots})/[\w./*?\[\]-]*\w[\w.*]*)", text))
    bad = sorted(p for p in paths if not _exists(p))
    names = set(re.findall(r"`([\w-]+\.(?:py|md|c|toml|xml|yaml|cfg))`", text))
    bad += sorted(f"{n} (no file of that name)" for n in names if n not in BASENAMES)
    assert not bad, bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_section_named_in_words_exists(doc: Path) -> None:
    text = " ".join(doc.read_text().split())
    bad = []
    for file, heading in re.findall(r"([\w./-]+\.md),? [\"“]([^\"”]+)[\"”]", text):
        path = _resolve(doc, file)
        if path is None:
            bad.append(f'{file}, "{heading}": no file {file}')
        elif not any(_plain(h).startswith(_plain(heading)) for h in _sections(path)):
            bad.append(f'{file}, "{heading}": no such heading in {path.relative_to(REPO)}')
    for file, number in re.findall(r"([\w./-]+\.md),? sections? (\d+\w?)", text):
        path = _resolve(doc, file)
        if path is None or not any(re.match(rf"{number}\b", h) for h in _headings(path)):
            bad.append(f"{file} section {number}: no such file or numbered section")
    assert not bad, bad


def test_the_slugs_are_github_s() -> None:
    assert slug("2b. Object stores: S3, GCS, Azure Blob") == "2b-object-stores-s3-gcs-azure-blob"
    assert slug("`transactional=true`") == "transactionaltrue"
    assert slug("Into 1,000 partitions") == "into-1000-partitions"
    assert slug("Kafka sink: transactional path (`transactional=true`)") == \
        "kafka-sink-transactional-path-transactionaltrue"
