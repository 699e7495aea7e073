"""JSON log lines: the context fields, and no secret in them."""

from __future__ import annotations

import io
import json
import logging

from connectors.core.secrets import RedactedDict
from connectors.monitoring.logs import enable_json_logs, log_context


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_carries_query_batch_sink_attempt_and_step() -> None:
    stream = io.StringIO()
    handler = enable_json_logs("connectors.test_logs", stream=stream)
    log = logging.getLogger("connectors.test_logs.sink")
    try:
        with log_context(query_id="q-1", sink_id="orders"):
            log.info("committed batch %d", 7, extra={"batch_id": 7, "attempt": 1,
                                                       "step": "commit"})
            with log_context(step="stage"):
                log.warning("slow")
        log.info("outside")
    finally:
        logging.getLogger("connectors.test_logs").removeHandler(handler)
    first, second, third = lines(stream)
    assert first["message"] == "committed batch 7"
    assert (first["query_id"], first["batch_id"], first["sink_id"], first["attempt"],
            first["step"]) == ("q-1", 7, "orders", 1, "commit")
    assert first["level"] == "INFO" and first["logger"] == "connectors.test_logs.sink"
    assert (second["step"], second["sink_id"], second["level"]) == ("stage", "orders", "WARNING")
    assert "query_id" not in third and "step" not in third


def test_secrets_never_reach_a_line() -> None:
    stream = io.StringIO()
    handler = enable_json_logs("connectors.test_logs2", stream=stream)
    log = logging.getLogger("connectors.test_logs2")
    conf = RedactedDict({"sasl.password": "hunter2-very-secret"})
    try:
        with log_context(password="p4ss-word-x"):
            log.info("connecting to postgresql://eo:s3cr3t-pw@db:5432/x with %s and %s",
                     conf, conf["sasl.password"])
        try:
            raise RuntimeError("failed with hunter2-very-secret")
        except RuntimeError:
            log.exception("boom")
    finally:
        logging.getLogger("connectors.test_logs2").removeHandler(handler)
    text = stream.getvalue()
    for secret in ("hunter2-very-secret", "s3cr3t-pw", "p4ss-word-x"):
        assert secret not in text, text
    first, second = lines(stream)
    assert first["password"] == "***"
    assert "postgresql://eo:" in first["message"]
    assert "RuntimeError" in second["exception"]
