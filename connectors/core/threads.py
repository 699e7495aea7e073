"""A call run on a thread of its own while the caller waits for something else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """``fn()`` started now on a daemon thread; :meth:`join` waits for it, :meth:`result`
    returns its value or raises its exception in the caller's thread.

    For work that only waits on the network (librdkafka and socket calls release the GIL)
    while the caller waits on another source, e.g. a sink task's fence while Spark hands
    over the task's first rows. Always :meth:`join` before touching what ``fn`` uses, also
    when the caller fails: ``fn`` may still be using it."""

    def __init__(self, fn: Callable[[], T], name: str = "eo-background") -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller by result()
            self._error = e

    def join(self) -> None:
        self._thread.join()

    def result(self) -> T | None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
