"""core/retry.py: the one retry-with-deadline and poll-until every connector uses."""

from __future__ import annotations

import time

import pytest

from connectors.core.errors import ConnectorError
from connectors.core.retry import poll_until, retry_until


class Flaky(Exception):
    pass


def _give_up(e: Exception, attempts: int, transient: bool) -> Exception:
    return RuntimeError(f"gave up after {attempts} ({'transient' if transient else 'fatal'}): {e}")


def test_transient_errors_are_asked_again_until_the_call_succeeds() -> None:
    calls, retries = [], []

    def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Flaky("not yet")
        return "ok"

    got = retry_until(call, timeout=5, transient=lambda e: isinstance(e, Flaky),
                      give_up=_give_up, on_retry=lambda e, n, pause: retries.append((n, pause)),
                      first_backoff=0.01)
    assert got == "ok" and len(calls) == 3
    assert [n for n, _ in retries] == [1, 2] and retries[1][1] == pytest.approx(0.02)


def test_a_fatal_error_gives_up_at_once_and_chains_the_cause() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise ValueError("bad")

    with pytest.raises(RuntimeError, match=r"gave up after 1 \(fatal\): bad") as e:
        retry_until(call, timeout=5, transient=lambda e: False, give_up=_give_up)
    assert isinstance(e.value.__cause__, ValueError) and len(calls) == 1


def test_the_deadline_bounds_the_retries() -> None:
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"\(transient\): still"):
        retry_until(lambda: (_ for _ in ()).throw(Flaky("still")), timeout=0.3,
                    transient=lambda e: True, give_up=_give_up, first_backoff=0.05,
                    max_backoff=0.1)
    assert time.monotonic() - began < 1.0


def test_a_connector_error_is_never_retried() -> None:
    with pytest.raises(ConnectorError, match="verdict"):
        retry_until(lambda: (_ for _ in ()).throw(ConnectorError("verdict")), timeout=5,
                    transient=lambda e: True, give_up=_give_up)


def test_poll_until_returns_the_first_truthy_value_or_none_at_the_timeout() -> None:
    seen = iter([None, 0, "found"])
    assert poll_until(lambda: next(seen), timeout=5, interval=0.001) == "found"
    began = time.monotonic()
    assert poll_until(lambda: None, timeout=0.1, interval=0.02) is None
    assert 0.1 <= time.monotonic() - began < 1.0


def test_max_retries_bounds_the_attempts_before_the_deadline() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise Flaky("still down")

    with pytest.raises(RuntimeError, match=r"gave up after 4 \(transient\)"):
        retry_until(call, timeout=60, transient=lambda e: isinstance(e, Flaky),
                    give_up=_give_up, first_backoff=0.001, max_retries=3)
    assert len(calls) == 4  # the first attempt and three retries


def test_zero_retries_means_one_attempt() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise Flaky("down")

    with pytest.raises(RuntimeError, match=r"gave up after 1 \(transient\)"):
        retry_until(call, timeout=60, transient=lambda e: isinstance(e, Flaky),
                    give_up=_give_up, max_retries=0)
    assert len(calls) == 1
