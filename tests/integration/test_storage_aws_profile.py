"""S3 credentials from the AWS CLI's shared files (issue 41, item 2), on the session's real S3
server, with no AWS_* credential in the environment and the instance identity pointed at a
closed port: a newcomer's ``~/.aws/credentials`` ``[default]`` (what ``aws configure``
writes) is read by ``eo-connectors wal show`` and by the storage layer; ``AWS_PROFILE``
picks another profile (the default one's keys are refused by the server, so only the named
profile's can pass); the profile's ``endpoint_url`` and ``region`` reach the client; a
``credential_process`` profile goes through boto3. Precedence without a server:
tests/unit/test_storage_aws_profile.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from connectors import cli
from connectors.core.storage import (
    check_create_if_absent,
    forget_probes,
    request_counts,
    storage_for,
    storage_options_from,
)
from connectors.core.wal import WriteAheadLog
from tests.helpers import REPO


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _bare_env(home: Path) -> dict[str, str]:
    """This process's environment without any AWS_* and with ``home`` as HOME; the instance
    identity asked at a closed port (so a client that ignored the files fails at once)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") or k == "AWS_CA_BUNDLE"}
    return {**env, "HOME": str(home), "AWS_METADATA_ENDPOINT": _closed_port()}


def _source_wal(s3: Any, url: str) -> None:
    """Two windows of a source WAL at ``url``, written with explicit options."""
    storage, root = storage_for(url, options=storage_options_from(s3.python_options(), "t"))
    wal = WriteAheadLog(storage, root, "source")
    for w in range(2):
        wal.append(w, {"window": w, "start": {"t": {"0": w * 5}}, "end": {"t": {"0": w * 5 + 5}}})
    wal.commit(0)


def _wal_show(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own module
        [sys.executable, "-m", "connectors", "wal", "show", *argv], env=env, cwd=REPO,
        capture_output=True, text=True, timeout=120)


def test_wal_show_reads_the_default_profile_aws_configure_writes(
        s3_service: Any, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/wal"
    _source_wal(s3_service, url)
    env = _bare_env(tmp_path)
    done = _wal_show(env, url, f"--storage=endpoint={s3_service.endpoint}")
    assert done.returncode == 2 and "no credentials were found" in done.stderr, done.stderr
    assert f"{tmp_path}/.aws/credentials (no such file)" in done.stderr, done.stderr

    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {s3_service.access_key}\n"
        f"aws_secret_access_key = {s3_service.secret_key}\n")
    (tmp_path / ".aws" / "config").write_text(
        f"[default]\nregion = {s3_service.region}\nendpoint_url = {s3_service.endpoint}\n")
    done = _wal_show(env, url)  # endpoint and region from the config file too
    assert done.returncode == 0, done.stderr
    assert "[source] last committed: 0" in done.stdout and "PENDING" in done.stdout
    assert s3_service.secret_key not in done.stdout + done.stderr


def test_aws_profile_and_the_file_variables_pick_the_profile(
        s3_service: Any, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/wal"
    _source_wal(s3_service, url)
    creds = tmp_path / "elsewhere" / "creds"
    creds.parent.mkdir()
    creds.write_text(
        "[default]\naws_access_key_id = not-a-key\naws_secret_access_key = not-a-secret\n\n"
        f"[eo]\naws_access_key_id = {s3_service.access_key}\n"
        f"aws_secret_access_key = {s3_service.secret_key}\n")
    env = {**_bare_env(tmp_path / "home"), "AWS_SHARED_CREDENTIALS_FILE": str(creds),
           "AWS_REGION": s3_service.region}
    flag = f"--storage=endpoint={s3_service.endpoint}"
    done = _wal_show(env, url, flag)  # the default profile's keys: refused by the server
    assert done.returncode == 2, done.stdout
    assert "credentials (from the AWS profile 'default' in " in done.stderr, done.stderr
    assert "not-a-secret" not in done.stderr
    done = _wal_show({**env, "AWS_PROFILE": "eo"}, url, flag)
    assert done.returncode == 0, done.stderr
    assert "[source] last committed: 0" in done.stdout
    done = _wal_show({**env, "AWS_PROFILE": "nope"}, url, flag)
    assert done.returncode == 2 and "AWS_PROFILE='nope': no such profile" in done.stderr
    assert "profiles there: default, eo" in done.stderr, done.stderr


def test_the_storage_layer_writes_with_a_profile_and_wal_show_only_reads(
        s3_service: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", _closed_port())
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[ci]\naws_access_key_id = {s3_service.access_key}\n"
        f"aws_secret_access_key = {s3_service.secret_key}\n")
    (tmp_path / ".aws" / "config").write_text(
        f"[profile ci]\nregion = {s3_service.region}\nendpoint_url = {s3_service.endpoint}\n")
    monkeypatch.setenv("AWS_PROFILE", "ci")
    forget_probes()
    url = f"s3://{s3_bucket}/state"
    storage, root = storage_for(url, options=None)  # nothing but the files
    check_create_if_absent(storage, root)
    wal = WriteAheadLog(storage, root, "source")
    wal.append(0, {"window": 0, "start": {"t": {"0": 0}}, "end": {"t": {"0": 3}}})
    wal.commit(0)
    assert wal.last_committed() == 0

    before = request_counts()
    assert cli.main(["wal", "show", url]) == 0, capsys.readouterr().err
    assert "[source] last committed: 0" in capsys.readouterr().out
    after = request_counts()
    assert after.get("PUT", 0) == before.get("PUT", 0)  # read-only: no write, no delete
    assert after.get("DELETE", 0) == before.get("DELETE", 0)
    assert after.get("LIST", 0) > before.get("LIST", 0)
    forget_probes()


def test_a_credential_process_profile_goes_through_boto3(
        s3_service: Any, s3_bucket: str, tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    url = f"s3://{s3_bucket}/wal"
    _source_wal(s3_service, url)
    script = tmp_path / "creds.py"
    script.write_text(textwrap.dedent(f"""\
        import json
        print(json.dumps({{"Version": 1, "AccessKeyId": {s3_service.access_key!r},
                           "SecretAccessKey": {s3_service.secret_key!r}}}))
        """))
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text(
        f"[profile proc]\ncredential_process = {sys.executable} {script}\n"
        f"region = {s3_service.region}\nendpoint_url = {s3_service.endpoint}\n")
    done = _wal_show({**_bare_env(tmp_path), "AWS_PROFILE": "proc"}, url)
    assert done.returncode == 0, done.stderr
    assert "[source] last committed: 0" in done.stdout
