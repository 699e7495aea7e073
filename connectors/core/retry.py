"""Retry with a deadline, and poll until: the two waiting helpers every connector uses.

- :func:`retry_until`: ask again on transient errors, with exponential backoff, until a
  deadline; the caller says what is transient and words the final error. The Kafka clients
  (``kafka/common.retrying``: transient Kafka errors, ``metadataRetryTimeout``), the JDBC
  sink (``jdbc/database.Database.retrying``: the dialect's transient errors,
  ``retryTimeout``) and every first contact (``core/contact.first_contact``: silence, until
  ``connectTimeout``) are this.
- :func:`poll_until`: ask a condition until it holds or a timeout passes (no fixed sleeps).

A :class:`~connectors.core.errors.ConnectorError` raised by the call is never retried: it is
already the connector's own verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from connectors.core.errors import ConnectorError

T = TypeVar("T")


def retry_until(
    call: Callable[[], T],
    *,
    timeout: float,
    transient: Callable[[Exception], bool],
    give_up: Callable[[Exception, int, bool], Exception],
    on_retry: Callable[[Exception, int, float], None] | None = None,
    first_backoff: float = 0.05,
    max_backoff: float = 2.0,
    max_retries: int | None = None,
) -> T:
    """``call()``, asked again while it raises an error ``transient`` accepts, ``timeout``
    seconds have not passed and (with ``max_retries``) it was asked again fewer than
    ``max_retries`` times, sleeping ``first_backoff`` doubling up to ``max_backoff`` (never
    past the deadline). The error raised at the end is ``give_up(error, attempts,
    was_transient)``, chained to the last error; ``on_retry(error, attempt, sleep)`` is
    called before each sleep (for a log line)."""
    deadline = time.monotonic() + timeout
    backoff = first_backoff
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except ConnectorError:
            raise
        except Exception as e:
            is_transient = transient(e)
            left = deadline - time.monotonic()
            spent = max_retries is not None and attempt > max_retries
            if not is_transient or left <= 0 or spent:
                raise give_up(e, attempt, is_transient) from e
            pause = min(backoff, left)
            if on_retry is not None:
                on_retry(e, attempt, pause)
            time.sleep(pause)
            backoff = min(backoff * 2, max_backoff)


def poll_until(condition: Callable[[], T | None], *, timeout: float,
               interval: float = 0.2) -> T | None:
    """The first truthy value of ``condition()``, asked every ``interval`` seconds, or
    None when ``timeout`` seconds pass first (``condition`` is asked at least once)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)
