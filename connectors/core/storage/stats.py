"""Counts of this process's storage operations, for the metrics (docs/monitoring.md,
"Storage").

Every operation that runs through the retry budget (:meth:`RetryBudget.run`: every write,
create, rename and mkdirs; on HDFS and object stores every request) counts once in
``operations``, each of its retries in ``retries``; a conditional create that found its
name taken counts in ``conflicts``. Keys are ``(store, op)``: ``store`` is ``file``,
``hdfs`` or the object store's provider (``s3``, ``gcs``, ``azure``), ``op`` the
operation (``create``, ``write``, ``rename``, ...).

Plain counters in this process, no dependency: the sinks' executors and Spark's Python
workers count here, and :mod:`connectors.monitoring.channel` carries a worker's totals to
the serving driver with its events (where it finds one; per process otherwise).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

OPERATIONS = "operations"
RETRIES = "retries"
CONFLICTS = "conflicts"

_counts: Counter[tuple[str, str, str]] = Counter()
_lock = threading.Lock()
_pid = os.getpid()


def add(what: str, store: str, op: str, n: int = 1) -> None:
    """Count ``n`` ``what`` (:data:`OPERATIONS`, :data:`RETRIES`, :data:`CONFLICTS`) of
    ``op`` on ``store``."""
    global _pid
    with _lock:
        if os.getpid() != _pid:  # a forked child starts from 0, not from its parent's counts
            _counts.clear()
            _pid = os.getpid()
        _counts[(what, store, op)] += n


def snapshot() -> dict[tuple[str, str, str], int]:
    """``{(what, store, op): count}``, this process's totals so far."""
    with _lock:
        if os.getpid() != _pid:
            return {}
        return dict(_counts)


def reset() -> None:
    """Forget the counts (tests)."""
    with _lock:
        _counts.clear()
