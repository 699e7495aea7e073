"""The retry budget of every store: how long a storage operation that failed transiently is
run again (docs/design.md, "Storage: the commit point is a create" and "Retry budgets: one
rule"; the table of faults is in docs/file-sink.md, "Storage faults").

One budget, declared once as ``storage.*`` options (``options.py``) and applied to every
store, so a full local disk, a NameNode restarting and an S3 503 SlowDown are ridden
through alike:

- ``storage.retryTimeout`` (120 s): from the operation's first failure, how long it is tried
  again;
- ``storage.maxRetries`` (100): how many times at most;
- ``storage.retryBackoff`` (100 ms) doubling up to ``storage.retryBackoffMax`` (2 s): the
  pauses. With the defaults ``retryTimeout`` decides (100 tries last over 3 minutes).

Why 120 s: a production NameNode that restarts loads its namespace, then stays in safe mode
at least ``dfs.namenode.safemode.extension`` (30 s) after its block reports; an S3 server
restarted on its machine answers again after its own start-up (SeaweedFS: up to 40 s on a
busy machine). The anchors agree: obstore's own default is 3 minutes, a Kafka producer
gives a record 2 (``delivery.timeout.ms``). A store that never answered is not waited for:
before its first answer in this process, a store's calls are a first contact, bounded by
``storage.connectTimeout`` (``connectors.core.contact``; each backend's ``_reach``).

On object stores obstore applies this budget to each request itself (its ``RetryConfig``),
and this module's loop takes only what obstore does not retry (``object_store_errors``).

What is transient is the backend's call (``disk.is_retried`` on local disks; the WebHDFS
and object-store modules classify their clients' errors). An operation is retried whole,
from a point where that is safe: a create writes a new temp file (or PUTs again, and a
retried create that finds its own object reads as "exists": every caller reads it back and
compares, see :func:`connectors.core.wal.create_or_same`).

Why not :func:`connectors.core.retry.retry_until`: a storage error that is not transient
must reach the caller unchanged (``FileExistsError`` and ``FileNotFoundError`` are answers
of the protocol, not failures), and a spent budget must be reported by the backend, which
names the store, the path and the condition (a full disk names its free space).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from connectors.core.storage import stats

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Retried:
    """How an operation's retries ended: tries made, seconds since its first failure."""

    tries: int
    seconds: float
    budget: RetryBudget

    def __str__(self) -> str:
        return (f"tried {self.tries} times over {self.seconds:.1f}s; the retry budget is "
                f"{self.budget}: raise them to ride through a longer outage")


@dataclass(frozen=True)
class RetryBudget:
    """``storage.retryTimeout``, ``storage.maxRetries``, ``storage.retryBackoff``,
    ``storage.retryBackoffMax`` (the declared defaults)."""

    timeout: float = 120.0
    max_retries: int = 100
    backoff: float = 0.1
    backoff_max: float = 2.0

    @classmethod
    def of(cls, options: Any) -> RetryBudget:
        """The budget the ``storage.*`` options (a ``StorageOptions``) set."""
        return cls(float(options.get("retryTimeout")), int(options.get("maxRetries")),
                   float(options.get("retryBackoff")), float(options.get("retryBackoffMax")))

    def __str__(self) -> str:
        return (f"storage.retryTimeout={self.timeout:g}s and "
                f"storage.maxRetries={self.max_retries}")

    def run(self, call: Callable[[], T], *, transient: Callable[[Exception], bool],
            what: Callable[[], str],
            give_up: Callable[[Exception, Retried | None], BaseException | None] | None = None,
            store: str = "", op: str = "") -> T:
        """``call()``, run again while it raises an error ``transient`` accepts and the
        budget lasts. When it ends with an error, ``give_up(error, retried)`` may return the
        error to raise instead (``retried`` is None when the error was not transient);
        None raises the call's own error unchanged. Each retry logs one WARNING. With a
        ``store``, the operation and each retry count in :mod:`.stats` as ``(store, op)``."""
        if store:
            stats.add(stats.OPERATIONS, store, op)
        first_failure: float | None = None
        backoff = self.backoff
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except Exception as e:
                now = time.monotonic()
                if first_failure is None:
                    first_failure = now
                retried: Retried | None = None
                if transient(e):
                    left = first_failure + self.timeout - now
                    if tries <= self.max_retries and left > 0:
                        pause = min(backoff, left)
                        log.warning("%s failed (try %d, transient: %s); trying again in %.1fs",
                                    what(), tries, _first_line(e), pause)
                        if store:
                            stats.add(stats.RETRIES, store, op)
                        time.sleep(pause)
                        backoff = min(backoff * 2, self.backoff_max)
                        continue
                    retried = Retried(tries, now - first_failure, self)
                replacement = give_up(e, retried) if give_up is not None else None
                if replacement is None:
                    raise
                raise replacement from e


def _first_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:300]
