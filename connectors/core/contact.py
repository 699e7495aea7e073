"""First contact or outage: has this process had an answer from a system once? (docs/design.md,
"Retry budgets: one rule").

Every system a connector talks to (a Kafka cluster, a database, HDFS, an object store) is
asked in one of two moods, and only this module knows which:

- **first contact**: nothing at that address has answered this process yet. A wrong host, a
  closed port or a firewall looks exactly like a server restarting, and waiting out a
  production restart for a typo helps nobody: the first contact is bounded by the system's
  ``connectTimeout`` (seconds) and fails with the address and the setting to check
  (:func:`first_contact`).
- **outage**: it answered before. A refused connection now is a restart, a failover or an
  election, and is ridden through within the system's long retry budget (``retryTimeout``,
  ``storage.retryTimeout``, ``metadataRetryTimeout``).

An *answer* is anything the system said, an error included (a refused password, a 503, a
database still starting, a NameNode in safe mode): it proves the address is right, and the
operation that follows meets it under the long budget. Only silence (refused, reset before a
word, timed out, unresolvable) keeps a system unreached.

The JDBC sink (``jdbc/database.py``), every remote store (``core/storage/``) and the Kafka
sink's re-check of its cluster (``kafka/sink/sink.py``) keep their "answered before" here, by
a key of their own (``("jdbc", url)``, a store's ``identity()``, a Kafka configuration).

**Tasks.** A Spark task runs only after the query's driver passed the sink's checks, which
reached every system the sink uses. A process that runs tasks (a Python worker) may not
have talked to them itself, so the Spark adapter calls :func:`in_task` and every system
counts as reached there: an outage that meets a task in a new worker is ridden through, not
taken for a first contact that would fail the task (and, in local mode, the query).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from connectors.core.retry import retry_until

_REACHED: set[Hashable] = set()
_LOCK = threading.Lock()
_IN_TASK = False


def reached(key: Hashable | None) -> bool:
    """Whether ``key`` answered this process once (always, in a process that runs tasks;
    ``None``: a system without an address, such as a local disk)."""
    if key is None or _IN_TASK:
        return True
    with _LOCK:
        return key in _REACHED


def mark(key: Hashable | None) -> None:
    """``key`` answered: from now on an outage of it is ridden through."""
    if key is not None:
        with _LOCK:
            _REACHED.add(key)


def in_task() -> None:
    """This process runs Spark tasks: the query's driver reached what they use."""
    global _IN_TASK
    _IN_TASK = True


def forget() -> None:
    """Forget every answer (tests)."""
    global _IN_TASK
    with _LOCK:
        _REACHED.clear()
    _IN_TASK = False


def first_contact(key: Hashable | None, ask: Callable[[float], object], *, timeout: float,
                  fail: Callable[[Exception, int, float], Exception],
                  answered: Callable[[Exception], bool] = lambda e: False,
                  backoff: float = 0.1, max_backoff: float = 1.0) -> None:
    """Nothing when ``key`` answered this process before. Otherwise ``ask(seconds left)``
    until the system answers: ``ask`` returns, or raises an error ``answered`` accepts. Any
    other error (silence) is asked again with backoff within ``timeout`` seconds from now,
    then ``fail(last error, attempts, seconds)`` is raised. A
    :class:`~connectors.core.errors.ConnectorError` from ``ask`` is the backend's own
    verdict (no credentials anywhere) and is raised at once. ``ask`` should bound its own
    wait by the seconds it is given."""
    if reached(key):
        return
    began = time.monotonic()
    deadline = began + timeout

    def once() -> None:
        try:
            ask(max(0.0, deadline - time.monotonic()))
        except Exception as e:
            if not answered(e):
                raise
            # The system spoke: the address is right; what it said is the operation's to
            # meet, under the long budget.

    def give_up(e: Exception, attempts: int, transient: bool) -> Exception:
        return fail(e, attempts, time.monotonic() - began)

    retry_until(once, timeout=timeout, transient=lambda e: True, give_up=give_up,
                first_backoff=backoff, max_backoff=max_backoff)
    mark(key)
