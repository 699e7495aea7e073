"""The AWS CLI's shared files for ``s3://`` paths (issue 41), without a network: which profile
is read, from which files, and the precedence of the ``storage.*`` options and the
environment over it, fact by fact (credentials, region, endpoint), as the AWS chain has it.
The store's configuration is read back from the obstore client itself. Against the real S3
server: tests/integration/test_storage_aws_profile.py."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from connectors.core.errors import StorageError
from connectors.core.storage import storage_for, storage_options_from
from connectors.core.storage.credentials import apply_aws_profile, aws_files_looked_at

CREDENTIALS = """\
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = default-secret

[ci]
aws_access_key_id = AKCI
aws_secret_access_key = ci-secret
aws_session_token = ci-token
"""
CONFIG = """\
[default]
region = eu-west-3
endpoint_url = http://s3.local:8333

[profile ci]
region = ap-south-1
aws_access_key_id = AKSHADOWED
aws_secret_access_key = shadowed

[profile settings-only]
region = us-west-2

[profile assumed]
role_arn = arn:aws:iam::123456789012:role/r
source_profile = default
"""


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME holds the files ``aws configure`` writes, and no AWS_*."""
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(CREDENTIALS)
    (tmp_path / ".aws" / "config").write_text(CONFIG)
    return {"HOME": str(tmp_path)}


def resolved(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, **options: str
             ) -> dict[str, Any]:
    """The configuration of the obstore client an ``s3://`` path gets under ``env``."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name == "HOME":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # a bucket per call: the client is built once per store and options in a process
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    storage, _ = storage_for(f"s3://{bucket}/wal",
                             options=storage_options_from(options or None, "t"))
    config: dict[str, Any] = dict(storage.store.config)
    config["allow_http"] = storage.store.client_options.get("allow_http")
    return config


def test_the_default_profile_of_the_files_aws_configure_writes(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = resolved(home, monkeypatch)
    assert (config["access_key_id"], config["secret_access_key"]) == ("AKDEFAULT",
                                                                      "default-secret")
    assert config["region"] == "eu-west-3" and config["endpoint"] == "http://s3.local:8333"
    assert config["allow_http"] in (True, "true")  # the profile's endpoint is http://


def test_aws_profile_names_the_profile_and_the_credentials_file_wins(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = resolved({**home, "AWS_PROFILE": "ci"}, monkeypatch)
    assert (config["access_key_id"], config["secret_access_key"], config["session_token"]) \
        == ("AKCI", "ci-secret", "ci-token")  # not the config file's AKSHADOWED
    assert config["region"] == "ap-south-1" and "endpoint" not in config


def test_the_files_can_live_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "creds.ini").write_text(CREDENTIALS)
    (tmp_path / "conf.ini").write_text(CONFIG)
    env = {"HOME": str(tmp_path / "nowhere"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "creds.ini"),
           "AWS_CONFIG_FILE": str(tmp_path / "conf.ini")}
    config = resolved(env, monkeypatch)
    assert config["access_key_id"] == "AKDEFAULT" and config["region"] == "eu-west-3"


def test_the_options_then_the_environment_come_first_fact_by_fact(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # storage.* options decide everything they give
    config = resolved(home, monkeypatch, accessKeyId="AKOPT", secretAccessKey="opt-secret",
                      region="us-east-2", endpoint="https://s3.example")
    assert (config["access_key_id"], config["region"], config["endpoint"]) == (
        "AKOPT", "us-east-2", "https://s3.example")
    # the environment's keys beat the profile's (obstore reads them itself: the client's
    # configuration holds none), the profile still gives region and endpoint
    env = {**home, "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "env-secret"}
    config = resolved(env, monkeypatch)
    assert "access_key_id" not in config and config["region"] == "eu-west-3"
    # and the environment's region and endpoint beat the profile's
    env = {**home, "AWS_REGION": "sa-east-1", "AWS_ENDPOINT_URL": "https://env.example"}
    config = resolved(env, monkeypatch)
    assert config["access_key_id"] == "AKDEFAULT"
    assert "region" not in config and "endpoint" not in config  # obstore's, from the env
    # web identity in the environment comes before the shared files too
    config = resolved({**home, "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token",
                       "AWS_ROLE_ARN": "arn:aws:iam::1:role/w"}, monkeypatch)
    assert "access_key_id" not in config
    # the AWS CLI's switch for configured endpoints
    config = resolved({**home, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}, monkeypatch)
    assert "endpoint" not in config and config["region"] == "eu-west-3"


def test_a_profile_without_keys_leaves_credentials_to_the_rest_of_the_chain(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = resolved({**home, "AWS_PROFILE": "settings-only"}, monkeypatch)
    assert "access_key_id" not in config and config["region"] == "us-west-2"


def test_no_files_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = resolved({"HOME": str(tmp_path)}, monkeypatch)
    assert "access_key_id" not in config and "region" not in config


def test_a_named_profile_that_is_not_there_is_an_error_naming_the_files(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError) as raised:
        resolved({**home, "AWS_PROFILE": "prod"}, monkeypatch)
    message = str(raised.value)
    assert "AWS_PROFILE='prod': no such profile" in message, message
    assert f"{home['HOME']}/.aws/credentials" in message and "[profile prod]" in message
    assert "profiles there: assumed, ci, default, settings-only" in message


def test_half_a_key_pair_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c").write_text("[default]\naws_access_key_id = AKHALF\n")
    with pytest.raises(StorageError, match="has aws_access_key_id but no aws_secret_access_key"):
        resolved({"HOME": str(tmp_path), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "c")},
                 monkeypatch)


def test_an_assumed_role_profile_goes_through_boto3(home: dict[str, str]) -> None:
    pytest.importorskip("boto3")
    config: dict[str, Any] = {}
    provider, source = apply_aws_profile(config, {}, {**home, "AWS_PROFILE": "assumed"})
    assert type(provider).__name__ == "Boto3CredentialProvider"
    assert source == f"profile 'assumed' in {home['HOME']}/.aws/config"
    assert "access_key_id" not in config


def test_secrets_are_never_logged_and_the_source_is(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        resolved({**home, "AWS_PROFILE": "ci"}, monkeypatch)
    text = caplog.text
    assert "profile 'ci'" in text, text
    assert "ci-secret" not in text and "ci-token" not in text


def test_the_error_without_credentials_names_the_files_and_the_profile(tmp_path: Path) -> None:
    said = aws_files_looked_at({"HOME": str(tmp_path), "AWS_PROFILE": "ci"})
    assert f"{tmp_path}/.aws/credentials (no such file) (AWS_SHARED_CREDENTIALS_FILE)" in said
    assert f"{tmp_path}/.aws/config (no such file) (AWS_CONFIG_FILE)" in said
    assert "profile AWS_PROFILE='ci'" in said


def test_a_file_that_is_not_ini_is_named_without_its_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c").write_text("aws_secret_access_key = leaked\n[default]\n")
    with pytest.raises(StorageError) as raised:
        resolved({"HOME": str(tmp_path), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "c")},
                 monkeypatch)
    message = str(raised.value)
    assert f"the AWS shared file {tmp_path / 'c'} cannot be read" in message, message
    assert "line 1" in message and "leaked" not in message
