"""The CLI's smaller things (issue 36, item 6): ``--help`` names the command as it was run
and shows no reStructuredText markup; every argument has help and the demo's show their
defaults; ``files status --json`` honours ``--last``; ``sink reset`` of another sink's state
says so; the demo's progress writes no carriage-return frames into a pipe or a file."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.sink import TaskInfo
from connectors.demo import app
from connectors.files.sink import FileSink
from tests.helpers import REPO

REPO_PATH = Path(REPO)


def parsers(p: argparse.ArgumentParser | None = None) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's, depth first."""
    p = p or cli.build_parser()
    found = [p]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += parsers(sub)
    return found


def test_help_names_the_command_as_it_was_run() -> None:
    assert cli.build_parser().format_usage().startswith("usage: eo-connectors ")
    done = subprocess.run([sys.executable, "-m", "connectors", "--help"], capture_output=True,
                          text=True, cwd=REPO, timeout=60, check=True)
    assert done.stdout.startswith("usage: python -m connectors ")
    assert "doctor" in done.stdout


@pytest.mark.parametrize("p", parsers(), ids=lambda p: p.prog)
def test_help_has_no_markup_and_every_argument_says_what_it_is(
        p: argparse.ArgumentParser) -> None:
    text = p.format_help()
    assert "``" not in text and ":func:" not in text and ":mod:" not in text, text
    for action in p._actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help, f"{p.prog}: {action.dest} has no help"


def test_demo_help_shows_its_defaults() -> None:
    (demo,) = [p for p in parsers() if p.prog.endswith(" demo")]
    text = " ".join(demo.format_help().split())
    for flag, default in (("--lines", "20000"), ("--batch-size", "1000"), ("--kills", "1"),
                          ("--timeout", "600")):
        help_text = text.split(flag, 2)[-1].split(" --", 1)[0]
        assert f"(default: {default})" in help_text, (flag, help_text)


def _files(tmp_path: Any, batches: int) -> str:
    path = str(tmp_path / "out")
    sink = FileSink(path, sink_id="f")
    for b in range(batches):
        rows = pa.record_batch({"id": [b]})
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([rows]))])
    return path


def test_files_status_json_honours_last(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = _files(tmp_path, 4)
    assert cli.main(["files", "status", path, "--json", "--last", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [b["batch_id"] for b in doc["batches"]] == [2, 3]
    assert doc["committed_batches"] == 4 and doc["files"] == 4
    assert cli.main(["files", "status", path, "--last", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 committed batches (the last 2 shown)" in out and "batch 1:" not in out


def test_sink_reset_of_another_sink_s_state_names_both(tmp_path: Any,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = _files(tmp_path, 2)
    assert cli.main(["sink", "reset", "--path", path, "--sink-id", "g"]) == 2
    err = capsys.readouterr().err
    assert "belongs to sink_id 'f' (an eo_files sink), not 'g'; nothing was reset" in err
    assert "give --sink-id f" in err and "give its own --path" in err
    assert "nothing was written" not in err  # not the write path's ownership error
    assert cli.main(["files", "status", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reset"] is None


def test_demo_progress_into_a_pipe_is_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    total, chunk = 1000, 50
    for start in range(0, total, chunk):
        app._progress(start + chunk, total, start)
    out = capsys.readouterr().out
    assert "\r" not in out
    assert out.splitlines() == [f"  produced {n}/{total} lines" for n in (250, 500, 750, 1000)]


# -- librdkafka's own lines stay out of the console --------------------------------------------
CLIENTS = {"Consumer", "Producer", "AdminClient"}
CONSOLE = ["connectors/demo", "connectors/cli.py", "connectors/cli_kafka.py",
           "connectors/doctor", "connectors/kafka/lookup.py"]


def _has_logger(node: ast.AST, assigned: dict[str, ast.AST]) -> bool:
    """A dict display with a "logger" key, or a name bound to one in the same function."""
    if isinstance(node, ast.Name) and node.id in assigned:
        return _has_logger(assigned[node.id], {})
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "logger" for k in node.keys)


def _client_calls(path: Path) -> list[str]:
    """Where a librdkafka client is made without ``logger`` (line numbers)."""
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        assigned: dict[str, ast.AST] = {}
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                    and isinstance(n.targets[0], ast.Name):
                assigned[n.targets[0].id] = n.value
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value:
                assigned[n.target.id] = n.value
        for n in ast.walk(fn):
            if not (isinstance(n, ast.Call) and getattr(n.func, "id", None) in CLIENTS):
                continue
            if any(k.arg == "logger" for k in n.keywords):
                continue
            if n.args and _has_logger(n.args[0], assigned):
                continue
            bad.append(f"{path.relative_to(REPO_PATH)}:{n.lineno}")
    return sorted(set(bad))


def test_every_client_the_cli_and_the_demo_make_routes_librdkafka_s_log() -> None:
    """A client without ``logger=LIBRDKAFKA_LOG`` prints librdkafka's lines
    (``%4|...|GETPID|... Coordinator load in progress``) straight to the console."""
    files = [p for c in CONSOLE for p in ([REPO_PATH / c] if c.endswith(".py")
                                          else sorted((REPO_PATH / c).rglob("*.py")))]
    assert len(files) > 5
    assert [b for f in files for b in _client_calls(f)] == []
