"""An object store with no credentials anywhere (issue 36, item 7): the real S3 server with
no key in the ``storage.*`` options nor the environment, so the client's last resort is the
instance identity at the cloud metadata endpoint; that endpoint refuses, answers 403, or
hangs. Each way, within 30 s, the error names the URL, says that no credentials were found,
and lists where they can come from: the ``storage.*`` options, the environment variables, the
AWS shared files and profile, and the instance identity. Through the storage layer, a sink's
state, and the CLI."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from connectors import cli
from connectors.core.errors import StorageError
from connectors.core.storage import (
    check_create_if_absent,
    forget_probes,
    storage_for,
    storage_options_from,
)

WITHIN = 30.0


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """A metadata endpoint that refuses (as a sandbox's or a locked-down VPC's proxy does)."""

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(403)
        self.end_headers()
        self.wfile.write(b"resolve_deny: denied destination")

    do_GET = do_PUT

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=["refuses", "forbidden", "hangs"])
def metadata_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of an instance-metadata endpoint that gives no credentials."""
    if request.param == "refuses":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"  # closed: connection refused
    elif request.param == "forbidden":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            server.server_close()
    else:
        with socket.socket() as s:  # accepts connections, never answers
            s.bind(("127.0.0.1", 0))
            s.listen(16)
            yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, metadata_endpoint: str,
                   tmp_path: Any) -> str:
    """No AWS credential of any kind in this process's environment nor in the AWS shared
    files (a HOME without ``.aws``); the instance identity asked at ``metadata_endpoint``."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", metadata_endpoint)
    forget_probes()
    return metadata_endpoint


def _options(s3_service: Any) -> dict[str, str]:
    """Where the server is, and nothing about who we are."""
    return {"endpoint": s3_service.endpoint, "region": s3_service.region}


def _assert_says_no_credentials(message: str, url: str) -> None:
    assert url in message, message
    assert "no credentials were found" in message, message
    for where in ("storage.accessKeyId", "storage.secretAccessKey", "AWS_ACCESS_KEY_ID",
                  "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE", "instance identity",
                  "instance profile", "/.aws/credentials (no such file)", "/.aws/config",
                  "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE unset"):
        assert where in message, (where, message)
    assert "unreachable" not in message  # the store was never the problem


def test_the_storage_probe_says_no_credentials_were_found(
        s3_service: Any, s3_bucket: str, no_credentials: str) -> None:
    url = f"s3://{s3_bucket}/wal"
    storage, root = storage_for(url, options=storage_options_from(_options(s3_service), "t"))
    began = time.monotonic()
    with pytest.raises(StorageError) as raised:
        check_create_if_absent(storage, root)
    assert time.monotonic() - began < WITHIN
    _assert_says_no_credentials(str(raised.value), url)
    forget_probes()


def test_a_sink_s_state_on_the_store_fails_with_the_same_words(
        s3_service: Any, s3_bucket: str, no_credentials: str) -> None:
    from connectors.kafka.sink import KafkaSink

    url = f"s3://{s3_bucket}/sink-wal"
    sink = KafkaSink("no-creds", url, bootstrap_servers="127.0.0.1:1", topic="t",
                     storage_options=_options(s3_service))
    began = time.monotonic()
    with pytest.raises(StorageError) as raised:
        sink.commit(0, [])
    assert time.monotonic() - began < WITHIN
    _assert_says_no_credentials(str(raised.value), url)
    forget_probes()


def test_the_cli_says_it_too(s3_service: Any, s3_bucket: str, no_credentials: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{s3_bucket}/out"
    flags = [f"--storage={k}={v}" for k, v in _options(s3_service).items()]
    began = time.monotonic()
    assert cli.main(["files", "status", url, *flags]) == 2
    _assert_says_no_credentials(capsys.readouterr().err, url)
    assert cli.main(["doctor", "--path", url, *flags]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL storage" in out and "no credentials were found" in out, out
    assert time.monotonic() - began < 2 * WITHIN
    forget_probes()
