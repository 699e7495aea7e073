"""The CLI's smaller things (issue 36, item 6): ``--help`` names the command as it was run
and shows no reStructuredText markup; every argument has help and the demo's show their
defaults; ``files status --json`` honours ``--last``; ``sink reset`` of another sink's state
says so; the demo's progress writes no carriage-return frames into a pipe or a file."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.sink import TaskInfo
from connectors.demo import app
from connectors.files.sink import FileSink
from tests.helpers import REPO


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
