"""The demo's closing advice (issue 36, item 4): the commands it prints for what it kept are
commands the CLI accepts, pointed at what the run wrote."""

from __future__ import annotations

import shlex

import pytest

from connectors.cli import build_parser
from connectors.demo.app import inspect_commands

CFG = {"bootstrap": "127.0.0.1:9092", "in_topic": "demo-lines-x", "out_topic": "demo-counts-x",
       "wal": "/tmp/eo demo/wal", "files": "/tmp/eo demo/files-out",
       "db_url": "sqlite:////tmp/eo demo/wordcount.db", "sink_id": "demo-x"}


@pytest.mark.parametrize("broker_up", [True, False])
def test_every_printed_command_parses_and_names_what_the_run_wrote(broker_up: bool) -> None:
    commands = inspect_commands(CFG, broker_up)
    seen = []
    for command, what in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "connectors"], command
        args = build_parser().parse_args(argv[3:])
        seen.append(args.func.__name__)
        assert ("rerun with --keep-broker" in what) == (
            not broker_up and args.func.__name__ in ("lag", "transactions")), what
    assert seen == ["wal_show", "wal_show", "files_status", "sink_status", "lag", "transactions"]
    parsed = [build_parser().parse_args(shlex.split(c)[3:]) for c, _ in commands]
    assert parsed[0].path == "/tmp/eo demo/wal/source"  # a path with a space survives pasting
    assert parsed[1].path == "/tmp/eo demo/wal/kafka-sink"
    assert parsed[3].url == CFG["db_url"] and parsed[3].sink_id == "demo-x"
    assert parsed[4].group == "demo-x" and parsed[4].bootstrap == "127.0.0.1:9092"
    assert parsed[5].topic == "demo-counts-x"


def test_a_database_password_is_not_printed() -> None:
    cfg = {**CFG, "db_url": "postgresql+psycopg://u:s3cret@db/x"}
    command, what = inspect_commands(cfg, True)[3]
    assert "s3cret" not in command and "***" in command and "password" in what
