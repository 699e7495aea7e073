"""Read-only commands never write (issue 41, item 1; docs/design.md, "The guarantee and what
it rests on"):
``sink status`` on a SQLite file that does not exist used to leave an empty database file
behind (sqlite creates one on connect); now it says the file does not exist and creates
nothing, and on one that exists it opens it read-only. ``wal show`` and ``files status``
leave every file of the state they read (names, sizes, modification times) as it was, and
create nothing for a path that does not exist. The Kafka commands and the object stores
are checked against the real services: tests/integration/test_cli_readonly.py and
tests/integration/test_storage_aws_profile.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

from connectors import cli
from connectors.core.sink import TaskInfo
from connectors.core.wal import WriteAheadLog
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` (itself included): size and mtime (ns)."""
    found = {}
    for path in [root, *root.rglob("*")]:
        st = path.stat()
        found[str(path.relative_to(root.parent))] = (st.st_size if path.is_file() else 0,
                                                     st.st_mtime_ns)
    return found


def test_sink_status_on_a_missing_sqlite_file_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for missing in (tmp_path / "nonexist.db", tmp_path / "no" / "such" / "dir.db"):
        for command in (["sink", "status"], ["sink", "reset", "--sink-id", "s"]):
            code, out, err = run(capsys, *command, "--url", f"sqlite:///{missing}")
            assert code == 2 and out == ""
            assert f"the SQLite database {missing} does not exist (nothing was created)" in err
    code, _, err = run(capsys, "sink", "status", "--url", f"sqlite:///{tmp_path}")
    assert code == 2 and "is a directory, not a database file" in err
    assert list(tmp_path.iterdir()) == []


def test_sink_status_opens_an_existing_sqlite_file_read_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "state" / "sinks.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    sink = JdbcSink(url, "t", "j", create_table=True)
    sink.check_schema(pa.schema([("id", pa.int64())]))
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([pa.record_batch({"id": [1]})]))])
    before = tree(db.parent)
    code, out, err = run(capsys, "sink", "status", "--url", url)
    assert code == 0 and "j: last committed batch 0" in out, err
    # A table it is asked about and that is not there stays absent.
    code, _, err = run(capsys, "sink", "status", "--url", url, "--table", "other")
    assert code == 2 and "has no table 'other'" in err
    assert tree(db.parent) == before
    # The connection it reads through refuses writes (mode=ro), whatever a query would do.
    made: list[sa.Engine] = []
    create = sa.create_engine

    def keep(*args: object, **kwargs: object) -> sa.Engine:
        engine = create(*args, **kwargs)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    monkeypatch.setattr(sa, "create_engine", keep)
    assert run(capsys, "sink", "status", "--url", url)[0] == 0
    (engine,) = made
    with engine.connect() as conn, pytest.raises(sa.exc.OperationalError, match="readonly"):
        conn.execute(sa.text("create table written (x int)"))
    engine.dispose()
    assert tree(db.parent) == before


def test_wal_show_and_files_status_leave_the_state_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wal = WriteAheadLog.open(str(tmp_path / "wal"), "source")
    for w in range(3):
        wal.append(w, {"window": w, "start": {"t": {"0": w}}, "end": {"t": {"0": w + 1}}})
        if w < 2:
            wal.commit(w)
    out_path = tmp_path / "out"
    sink = FileSink(str(out_path), sink_id="f")
    for b in range(2):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([pa.record_batch({"id": [b]})]))])
    sink.stage(TaskInfo(2, 0), iter([pa.record_batch({"id": [2]})]))  # staged, not committed
    before = tree(tmp_path)
    for argv in (["wal", "show", str(tmp_path / "wal")],
                 ["wal", "show", str(tmp_path / "wal"), "--kind", "source", "--json"],
                 ["wal", "show", str(out_path)],
                 ["files", "status", str(out_path), "-v"],
                 ["files", "status", str(out_path), "--json"]):
        code, _, err = run(capsys, *argv)
        assert code == 0, (argv, err)
    assert tree(tmp_path) == before


def test_status_commands_on_paths_that_do_not_exist_create_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in (["wal", "show", str(tmp_path / "nowal")],
                 ["wal", "show", f"file://{tmp_path}/nowal"],
                 ["wal", "show", "relative-wal"],
                 ["files", "status", str(tmp_path / "nofiles")],
                 ["doctor", "--path", str(tmp_path / "deeper" / "wal")]):
        code, _, _ = run(capsys, *argv)
        assert code in (0, 1, 2), argv
    assert list(tmp_path.iterdir()) == []
