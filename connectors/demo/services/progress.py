"""Progress lines while a long step runs: one at least every :data:`PERIOD` seconds.

A first run on a fresh machine resolves jars and builds the schema registry from Maven
Central (minutes), and a broker on a loaded machine can take tens of seconds to answer; a
console or a CI log that stays silent that long reads as a hang. :func:`heartbeat` says,
while a block runs, what the step is doing, for how long, and what it has done so far
("still resolving the 'kafka' jars from Maven Central (20 s; 142 files downloaded so far)").
Each is one plain line, never a carriage-return frame, so a pipe or a log gets lines too.

A service is given ``say`` (the demo passes ``print``); without it, :func:`say_or_log`
logs the lines at INFO through the service's own logger (the test sessions' case).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

#: The longest silence, in seconds, of a step that says how it is going.
PERIOD = 10.0

#: Where a progress line goes: ``print``, or a logger through :func:`say_or_log`.
Say = Callable[[str], None]


def say_or_log(say: Say | None, logger: logging.Logger) -> Say:
    """``say`` when given, else an INFO line of ``logger``."""
    if say is not None:
        return say
    return lambda line: logger.info("%s", line)


class Heartbeat:
    """Says ``status(seconds elapsed)`` through ``say`` each time ``period`` seconds have
    passed since the step began (at ``period``, ``2 * period``, ...), when :meth:`beat` is
    called at or after that moment. A beat called late (a machine suspended for a minute)
    says one line, not the missed ones, and the next stays on the same grid."""

    def __init__(self, say: Say, status: Callable[[float], str], *,
                 period: float = PERIOD, clock: Callable[[], float] = time.monotonic) -> None:
        if period <= 0:
            raise ValueError(f"a heartbeat's period must be positive, not {period}")
        self._say = say
        self._status = status
        self._period = period
        self._clock = clock
        self.began = clock()
        self._next = self.began + period

    def due_in(self) -> float:
        """Seconds until the next line is due (0 when it is)."""
        return max(0.0, self._next - self._clock())

    def beat(self) -> bool:
        """Say the status if a line is due; whether it did."""
        now = self._clock()
        if now < self._next:
            return False
        while self._next <= now:
            self._next += self._period
        self._say(self._status(now - self.began))
        return True


@contextlib.contextmanager
def heartbeat(say: Say, status: Callable[[float], str],
              period: float | None = None) -> Iterator[Heartbeat]:
    """While the block runs, a daemon thread says ``status(elapsed)`` every ``period``
    seconds (default :data:`PERIOD`), so a blocking call (a subprocess, a readiness poll)
    needs no change to report. The thread is stopped and joined when the block ends,
    however it ends: no line follows the step's own last word."""
    beat = Heartbeat(say, status, period=PERIOD if period is None else period)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(beat.due_in()):
            beat.beat()

    thread = threading.Thread(target=run, name="eo-progress", daemon=True)
    thread.start()
    try:
        yield beat
    finally:
        stop.set()
        thread.join()
