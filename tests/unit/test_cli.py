"""The operator CLI on state it can be given without services: a WAL on disk and a
metadata table in SQLite. (tests/integration/test_soak.py runs every command against the
state a real pipeline left behind.)"""

from __future__ import annotations

import json

import sqlalchemy as sa

from connectors.cli import main
from connectors.core.wal import WriteAheadLog


def test_wal_show_text_and_json(tmp_path, capsys):
    wal = WriteAheadLog.open(str(tmp_path / "wal"), "source")
    wal.append(0, {"window": 0, "start": {"t": {"0": 0}}, "end": {"t": {"0": 10}}})
    wal.commit(0)
    wal.append(1, {"window": 1, "start": {"t": {"0": 10}}, "end": {"t": {"0": 25}}})
    assert main(["wal", "show", str(tmp_path / "wal")]) == 0
    out = capsys.readouterr().out
    assert "committed" in out and "PENDING" in out and "t[0] 10..25" in out
    assert main(["wal", "show", str(tmp_path / "wal"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    entries = doc["logs"]["source"]["entries"]
    assert [(e["seq"], e["committed"]) for e in entries] == [(0, True), (1, False)]


def test_wal_show_missing_path_is_a_clear_error(tmp_path, capsys):
    assert main(["wal", "show", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sink_status_reads_metadata_and_redacts(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("create table eo_sink_commits (sink_id text primary key, "
                          "batch_id bigint, rows bigint, committed_at timestamp)"))
        c.execute(sa.text("insert into eo_sink_commits values ('a', 7, 70, '2026-01-01'),"
                          " ('b', 3, 30, '2026-01-02')"))
    engine.dispose()
    assert main(["sink", "status", "--url", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["sink_id"], s["batch_id"]) for s in doc["sinks"]] == [("a", 7), ("b", 3)]
    assert main(["sink", "status", "--url", url, "--sink-id", "b"]) == 0
    assert "b: last committed batch 3" in capsys.readouterr().out
    code = main(["sink", "status", "--url", "postgresql+psycopg://u:topsecret@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 2 and "topsecret" not in err and "***" in err


def test_wal_show_finds_the_logs_under_the_path_it_is_given(tmp_path, capsys):
    from connectors.core.sink_state import SinkState
    from connectors.core.storage import LocalStorage

    state = SinkState(LocalStorage(), str(tmp_path / "wal"), log_kind="commits", keep=10,
                      markers="started")
    state.put_marker(3, 0, b"{}")
    state.record_commit(2, "k", 5)
    assert main(["wal", "show", str(tmp_path / "wal")]) == 0  # the WAL root
    out = capsys.readouterr().out
    assert "[commits] last committed: 2" in out and "committed" in out and "(empty)" not in out
    assert "[started]" not in out
    assert main(["wal", "show", str(tmp_path / "wal" / "commits")]) == 0  # the log itself
    assert "[commits] last committed: 2" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["wal", "show", str(tmp_path / "empty")]) == 2
    assert "holds no write-ahead log" in capsys.readouterr().err
