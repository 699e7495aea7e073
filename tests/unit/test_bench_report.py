"""BENCHMARKS.md is generated whole from bench/results/, and a run adds to bench/HISTORY.md
(issue 45, item 7).

A ``--only`` run used to patch the old BENCHMARKS.md in place and replaced the hand-written
note above its table, losing history once. Now each benchmark's latest figures live in its
own file, the report is rendered from all of them, and the run log only grows: merging one
benchmark's log must change that benchmark's rows and nothing else.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _load_run_all() -> ModuleType:
    """bench/run_all.py as a module (bench/ is a directory of scripts, not a package; its
    sibling ``_report`` is found the way the script finds it)."""
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


run_all = _load_run_all()

JDBC_RESULT = {"bench": "jdbc_throughput", "rows": 1000, "eo_jdbc_rows_per_s": 3000,
               "spark_jdbc_rows_per_s": 1000, "raw_copy_rows_per_s": 6000,
               "ratio_spark_jdbc": 3.0, "ratio_raw_copy": 0.5, "commit_overhead_ms": 2.5}
MEASURED = dt.date(2026, 12, 1)


def _table_rows(md: str) -> list[str]:
    return [line for line in md.split("\n\nOther figures:")[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| benchmark", "| pipeline"))
            and "| --- " not in line and line.split("|")[1].strip() in
            {*run_all.BENCHES, "peak Python worker RSS, 1,000 partitions / 4 partitions"}]


def _log(tmp_path: Path, name: str, result: dict[str, object]) -> Path:
    """A benchmark's saved output: its own log lines, then the RESULT line, written on
    :data:`MEASURED`."""
    path = tmp_path / f"{name}.log"
    path.write_text(f"== warming up\nsome line of {name}'s own\nRESULT {json.dumps(result)}\n")
    stamp = dt.datetime.combine(MEASURED, dt.time(12)).timestamp()
    os.utime(path, (stamp, stamp))
    return path


@pytest.fixture
def suite(tmp_path: Path) -> dict[str, Path]:
    """A copy of the repository's store without jdbc, its history, and the report they
    make, in ``tmp_path``."""
    paths = {"results": tmp_path / "results", "out": tmp_path / "BENCHMARKS.md",
             "history": tmp_path / "HISTORY.md", "chart": tmp_path / "benchmarks.png"}
    shutil.copytree(BENCH / "results", paths["results"])
    (paths["results"] / "jdbc.json").unlink()
    shutil.copy(BENCH / "HISTORY.md", paths["history"])
    run_all.write_benchmarks(str(paths["results"]), str(paths["out"]), str(paths["chart"]))
    return paths


def _main(suite: dict[str, Path], *args: str) -> int:
    code: int = run_all.main([*args, *(f"--{k}={v}" for k, v in suite.items())])
    return code


def test_the_committed_report_is_the_one_the_store_makes() -> None:
    """BENCHMARKS.md is generated, never edited by hand: rendering bench/results/ gives the
    committed file byte for byte."""
    records = run_all.load_records(str(BENCH / "results"))
    rendered = run_all.render(records, run_all.TARGETS, run_all.CROSS, "docs/benchmarks.png")
    assert rendered == (REPO / "BENCHMARKS.md").read_text()


def test_every_row_names_its_command_and_date() -> None:
    rows = _table_rows((REPO / "BENCHMARKS.md").read_text())
    assert rows
    for row in rows:
        measured, reproduce = [c.strip() for c in row.split("|")[-3:-1]]
        dt.date.fromisoformat(measured.split(" / ")[0])
        assert reproduce.startswith("`python bench/") and "--rows " in reproduce, row


def test_a_merged_log_adds_its_rows_and_keeps_every_other_row_and_the_history(
        suite: dict[str, Path], tmp_path: Path) -> None:
    before = suite["out"].read_text()
    history_before = suite["history"].read_text()
    log = _log(tmp_path, "jdbc", JDBC_RESULT)

    assert _main(suite, "--only", "jdbc", "--from-log", f"jdbc={log}") == 0

    after = suite["out"].read_text()
    command = "`python bench/jdbc_throughput.py --rows 1000`"
    new_rows = [
        f"| jdbc | 1000 | 3,000 | spark_jdbc: 1,000 | 3.00 (target >= 2.0) | yes | 2026-12-01 "
        f"| {command} |",
        f"| jdbc | 1000 | 3,000 | raw_copy: 6,000 | 0.50 (target >= 0.5) | yes | 2026-12-01 "
        f"| {command} |"]
    rows = _table_rows(after)
    assert [r for r in rows if not r.startswith("| jdbc |")] == _table_rows(before)
    # The ratios this result lacks (a section the run skipped) keep their rows, with "-".
    jdbc_rows = [r for r in rows if r.startswith("| jdbc |")]
    assert jdbc_rows[:2] == new_rows and all("| - |" in r for r in jdbc_rows[2:])
    assert rows.index(new_rows[0]) == 6  # in BENCHES' order, after the three source rows
    assert f"- **jdbc** (2026-12-01, {command}): commit_overhead_ms=2.5" in after
    stored = json.loads((suite["results"] / "jdbc.json").read_text())
    assert stored["result"] == JDBC_RESULT
    assert (stored["measured"], stored["command"]) == ("2026-12-01", command.strip("`"))

    history = suite["history"].read_text()
    intro, _, old_entries = history_before.partition("\n## ")
    assert history.startswith(intro) and history.endswith("\n## " + old_entries)
    entry = history[len(intro):-len(old_entries) - 4]
    assert entry.strip().startswith(f"## {dt.date.today().isoformat()}: `python bench/run_all.py "
                                    f"--only jdbc --from-log jdbc=jdbc.log`")
    assert (f"- **jdbc**, merged from its log jdbc.log (measured 2026-12-01): {command}: "
            "ratio_spark_jdbc 3.0, ratio_raw_copy 0.5") in entry


def test_a_second_merge_replaces_that_benchmark_only_and_the_history_grows(
        suite: dict[str, Path], tmp_path: Path) -> None:
    """The ``--only`` case that lost history once: re-running kafka_sink_p1000 changes its
    rows; every other row stays, and both runs' entries stay, newest first."""
    p1000 = json.loads((suite["results"] / "kafka_sink_p1000.json").read_text())["result"]
    faster = {**p1000, "txn_rows_per_s": 3_000_000, "txn_ratio_spark_kafka_sink": 2.977}
    before = _table_rows(suite["out"].read_text())

    assert _main(suite, "--only", "jdbc", "--from-log",
                 f"jdbc={_log(tmp_path, 'jdbc', JDBC_RESULT)}") == 0
    middle = _table_rows(suite["out"].read_text())
    assert _main(suite, "--only", "kafka_sink_p1000", "--from-log",
                 f"kafka_sink_p1000={_log(tmp_path, 'p1000', faster)}") == 0
    after = _table_rows(suite["out"].read_text())

    expected = [m.replace("| 2026-11-29 |", "| 2026-12-01 |")
                if m.startswith("| kafka_sink_p1000 |") else m for m in middle]
    txn = next(i for i, m in enumerate(expected) if m.startswith("| kafka_sink_p1000 |"))
    expected[txn] = expected[txn].replace("2,027,010", "3,000,000").replace("| 2.01 ", "| 2.98 ")
    assert after == expected
    assert [r for r in middle if not r.startswith("| jdbc |")] == before
    history = suite["history"].read_text()
    newest = history.index("`python bench/run_all.py --only kafka_sink_p1000 --from-log "
                           "kafka_sink_p1000=p1000.log`")
    assert newest < history.index("`python bench/run_all.py --only jdbc --from-log "
                                  "jdbc=jdbc.log`") < history.index("\n## 2026-11-29\n")


def test_a_failed_run_keeps_the_figures_and_says_so(
        suite: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark that fails (here: as run_one reports a timeout) leaves its file and rows
    as they were; the run's entry says it failed and the exit status is 1."""
    store_before = (suite["results"] / "avro.json").read_text()
    rows_before = _table_rows(suite["out"].read_text())
    monkeypatch.setattr(run_all, "run_one", lambda name, rows, timeout: {
        "bench": name, "error": f"timed out after {timeout}s"})

    assert _main(suite, "--only", "avro", "--timeout", "5") == 1

    assert (suite["results"] / "avro.json").read_text() == store_before
    assert _table_rows(suite["out"].read_text()) == rows_before
    assert ("- **avro**: failed (timed out after 5.0s); its figures are older"
            in suite["history"].read_text())


@pytest.mark.parametrize("bad", ["nosuch=x.log", "avro", "jdbc=x.log"])
def test_a_bad_from_log_is_refused_before_anything_runs(
        suite: dict[str, Path], bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown benchmark, no file, or a benchmark this ``--only`` run does not measure."""
    history = suite["history"].read_text()
    with pytest.raises(SystemExit) as exc:
        _main(suite, "--only", "avro", "--from-log", bad)
    assert exc.value.code == 2
    assert "give NAME=FILE with NAME a benchmark of this run: avro" in capsys.readouterr().err
    assert suite["history"].read_text() == history


def test_a_log_without_a_result_line_is_refused(suite: dict[str, Path],
                                                 tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("Traceback (most recent call last):\n")
    with pytest.raises(SystemExit, match="empty.log: no RESULT line"):
        _main(suite, "--only", "jdbc", "--from-log", f"jdbc={log}")
