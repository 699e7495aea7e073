"""Failpoints: off by default, parsed from CONNECTORS_FAILPOINTS, SIGKILL or raise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import timeit

import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError


def test_parse_syntax():
    specs = failpoints.parse("jdbc.after_stage@3, kafka_sink.mid_produce@2#500!raise,files.x")
    assert specs["jdbc.after_stage"][0].batch == 3
    mid = specs["kafka_sink.mid_produce"][0]
    assert (mid.batch, mid.after, mid.action) == (2, 500, "raise")
    assert specs["files.x"][0].batch is None
    with pytest.raises(ValueError, match="unknown action"):
        failpoints.parse("a!explode")


def test_disabled_hit_is_a_noop(monkeypatch):
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.reload()
    failpoints.hit("jdbc.after_stage", 3)
    assert failpoints.wants_count("jdbc.after_stage") is None
    # "costs nothing measurable": one dict lookup; generous bound against a noisy machine
    per_call = min(timeit.repeat(lambda: failpoints.hit("x.y", 1), number=10000, repeat=3))
    assert per_call / 10000 < 5e-6


def test_raise_action_batch_and_count(monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.ENV, "p.q@2#10!raise")
    monkeypatch.setenv(failpoints.ENV_ONCE_DIR, str(tmp_path))
    failpoints.reload()
    try:
        failpoints.hit("p.q", 1, count=100)  # other batch
        failpoints.hit("p.q", 2, count=9)  # not enough records yet
        assert failpoints.wants_count("p.q") == 10
        with pytest.raises(FailpointError, match="p.q fired at batch 2"):
            failpoints.hit("p.q", 2, count=10)
        failpoints.hit("p.q", 2, count=11)  # once-dir: fires only once
    finally:
        monkeypatch.delenv(failpoints.ENV)
        failpoints.reload()


def test_kill_action_sigkills_the_process():
    env = {**os.environ, failpoints.ENV: "a.b@1", "PYTHONPATH": os.getcwd()}
    code = (
        "from connectors.core import failpoints as f; "
        "f.hit('a.b', 0); f.hit('a.b', 1); print('alive')"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    assert "alive" not in proc.stdout
    assert "failpoint a.b fired at batch 1" in proc.stderr
