"""The CLI's smaller things (issue 36, item 6): ``--help`` names the command as it was run
and shows no reStructuredText markup; every argument has help and the demo's show their
defaults; ``files status --json`` honours ``--last``; ``sink reset`` of another sink's state
says so; the demo's progress writes no carriage-return frames into a pipe or a file. Issue 41,
item 3: --help shows every default, ``wal show --kind`` takes only a log kind, and says when
retention removed a log's older entries. (``lag``'s eo_kafka hint: test_cli_lookup.py.)"""

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
from connectors.core.wal import WriteAheadLog
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


# -- issue 41, item 3 ------------------------------------------------------------------------------
def test_help_shows_every_default_worth_knowing() -> None:
    """Every option with a default other than none/off shows it in --help."""
    missing = []
    for p in parsers():
        for action in p._actions:
            if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings \
                    or isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction)):
                continue
            said = p._get_formatter()._expand_help(action)  # as --help prints it
            values = {str(action.default)} | ({f"{action.default:g}"}
                                              if isinstance(action.default, float) else set())
            if "default" not in said or not any(v in said for v in values):
                missing.append(f"{p.prog} {action.option_strings[-1]}: {said}")
    assert missing == []
    helps = {p.prog.split(" ", 1)[1]: " ".join(p.format_help().split()) for p in parsers()[1:]}
    assert "(default: 15.0)" in helps["lag"] and "(default: 15.0)" in helps["transactions"]
    assert "(default: 0; --abort needs it)" in helps["transactions"]
    assert "(default: eo_sink_commits)" in helps["sink status"]
    assert "(default: eo_sink_commits)" in helps["sink reset"]


def test_wal_show_kind_is_one_of_the_log_kinds(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["wal", "show", str(tmp_path), "--kind", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kind: invalid choice: 'bogus'" in err, err
    assert "'source', 'commits', '_eo_log', 'sink'" in err, err


def test_wal_show_says_retention_removed_the_older_entries(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.core.storage import LocalStorage
    from connectors.kafka.sink.recovery import KEEP_COMMITS, sink_state

    state = sink_state(LocalStorage(), str(tmp_path / "wal"))
    for b in range(25):  # retention at 10 and 20 keeps the newest KEEP_COMMITS
        state.record_commit(b, "k", 100 + b)
        state.retain(b)
    code = cli.main(["wal", "show", str(tmp_path / "wal")])
    out = capsys.readouterr().out
    assert code == 0
    first = 20 - KEEP_COMMITS + 1
    assert f"entries before {first} were removed by retention: this log keeps its newest " \
           f"{KEEP_COMMITS}, deleting older ones at every 10th commit, so it holds " \
           f"{KEEP_COMMITS} to {KEEP_COMMITS + 9} entries: here {25 - first}, {first} to 24 " \
           "(the last deletion ran at commit 20)" in out, out
    assert f"{first:>8}  committed" in out and f"{first - 1:>8}  committed" not in out
    # each entry shows what its marker holds (issue 50: every one printed as {})
    shown = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(s[0]) for s in shown] == list(range(first, 25))
    for seq, *rest in shown:
        assert " ".join(rest).startswith(f"committed rows {100 + int(seq)}, sink_id k, "
                                         "committed 20"), rest
    assert "{}" not in out
    assert cli.main(["wal", "show", str(tmp_path / "wal"), "--last", "3", "--json"]) == 0
    log = json.loads(capsys.readouterr().out)["logs"]["commits"]
    assert [e["seq"] for e in log["entries"]] == [22, 23, 24]
    assert log["entries_in_log"] == 25 - first and log["keeps"] == KEEP_COMMITS
    assert log["retention_note"].startswith(f"entries before {first} were removed")
    assert cli.main(["wal", "show", str(tmp_path / "wal"), "--last", "3"]) == 0
    assert f"; the last 3 of {25 - first} entries shown" in capsys.readouterr().out


def test_a_log_that_retention_never_touched_says_nothing_of_it(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    wal = WriteAheadLog.open(str(tmp_path / "wal"), "source")
    for w in (5, 6, 7):  # a log that began at 5, with fewer entries than retention keeps
        wal.append(w, {"window": w})
        wal.commit(w)
    assert cli.main(["wal", "show", str(tmp_path / "wal")]) == 0
    assert "removed by retention" not in capsys.readouterr().out
