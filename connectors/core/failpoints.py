"""Named crash points for recovery tests. They do nothing unless enabled.

Every step of every commit protocol calls ``hit("<family>.<step>", batch_id)``. A test turns
points on through the environment, which Spark's Python workers inherit from the driver::

    CONNECTORS_FAILPOINTS="jdbc.after_stage@3"          # SIGKILL at batch 3
    CONNECTORS_FAILPOINTS="kafka_sink.mid_produce@2#500" # ... after 500 records of batch 2
    CONNECTORS_FAILPOINTS="files.before_log"              # at any batch
    CONNECTORS_FAILPOINTS="kafka_sink.mid_produce@1#100!raise"  # raise FailpointError instead

Several specs are separated by commas. Actions: ``kill`` (default) sends SIGKILL; ``raise``
raises :class:`FailpointError` (a task failure Spark can retry); ``pause`` holds the task at
the point until the test says go: it creates ``<key>.reached`` in
``CONNECTORS_FAILPOINTS_PAUSE_DIR`` and waits (up to 120 s) for ``<key>.go`` there (a fault
test stops a broker while a task stands between two protocol steps).

``CONNECTORS_FAILPOINTS_SCOPE=group`` makes ``kill`` SIGKILL the whole process group, so a
point reached in a Python worker takes the driver, the JVM and every worker down at once:
a real crash of the application, not a task failure. The test harness starts the pipeline
with ``start_new_session=True`` so that the group is the pipeline alone.

``CONNECTORS_FAILPOINTS_ONCE_DIR=<dir>`` makes each spec fire only once across processes
(a marker file is created in that directory when it fires), so a retried task passes.

When the variable is unset, ``hit`` is one dict lookup on a frozen empty mapping.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass

from connectors.core.errors import FailpointError

log = logging.getLogger(__name__)

ENV = "CONNECTORS_FAILPOINTS"
ENV_SCOPE = "CONNECTORS_FAILPOINTS_SCOPE"
ENV_ONCE_DIR = "CONNECTORS_FAILPOINTS_ONCE_DIR"
ENV_PAUSE_DIR = "CONNECTORS_FAILPOINTS_PAUSE_DIR"
#: The longest a ``pause`` failpoint waits for its go.
PAUSE_LIMIT = 120.0


@dataclass(frozen=True)
class FailpointSpec:
    name: str
    batch: int | None = None
    after: int | None = None
    action: str = "kill"

    @property
    def key(self) -> str:
        b = "" if self.batch is None else f"@{self.batch}"
        a = "" if self.after is None else f"#{self.after}"
        return f"{self.name}{b}{a}!{self.action}"


def parse(text: str) -> dict[str, list[FailpointSpec]]:
    """Parse the ``CONNECTORS_FAILPOINTS`` syntax into specs keyed by point name."""
    out: dict[str, list[FailpointSpec]] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        action = "kill"
        if "!" in item:
            item, action = item.split("!", 1)
            if action not in ("kill", "raise", "pause"):
                raise ValueError(f"{ENV}: unknown action {action!r} in {raw!r}; use kill, "
                                 "raise or pause")
        after = None
        if "#" in item:
            item, count = item.split("#", 1)
            after = int(count)
        batch = None
        if "@" in item:
            item, b = item.split("@", 1)
            batch = int(b)
        spec = FailpointSpec(item.strip(), batch, after, action)
        out.setdefault(spec.name, []).append(spec)
    return out


_ACTIVE: dict[str, list[FailpointSpec]] = parse(os.environ.get(ENV, ""))


def reload() -> None:
    """Re-read the environment (tests that set it after import call this)."""
    global _ACTIVE
    _ACTIVE = parse(os.environ.get(ENV, ""))


def enabled() -> bool:
    return bool(_ACTIVE)


def hit(name: str, batch_id: int | None = None, count: int | None = None) -> None:
    """Crash here if a spec names this point (and this batch, and ``count >= #n``)."""
    specs = _ACTIVE.get(name)
    if not specs:
        return
    for spec in specs:
        if spec.batch is not None and spec.batch != batch_id:
            continue
        if spec.after is not None and (count is None or count < spec.after):
            continue
        if not _claim_once(spec):
            continue
        _fire(spec, batch_id)


def wants_count(name: str) -> int | None:
    """The smallest ``#n`` configured for ``name``, so hot loops can skip counting otherwise."""
    specs = _ACTIVE.get(name)
    if not specs:
        return None
    counts = [s.after for s in specs if s.after is not None]
    return min(counts) if counts else 0


def _claim_once(spec: FailpointSpec) -> bool:
    once_dir = os.environ.get(ENV_ONCE_DIR)
    if not once_dir:
        return True
    marker = os.path.join(once_dir, spec.key.replace("/", "_"))
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _fire(spec: FailpointSpec, batch_id: int | None) -> None:
    message = f"failpoint {spec.name} fired at batch {batch_id} (pid {os.getpid()})"
    if spec.action == "raise":
        log.warning("%s: raising", message)
        raise FailpointError(message)
    if spec.action == "pause":
        _pause(spec, message)
        return
    sys.stderr.write(message + ": SIGKILL\n")
    sys.stderr.flush()
    if os.environ.get(ENV_SCOPE) == "group":
        # PySpark's worker daemon moves itself and its workers into a process group of their
        # own (daemon.py: os.setpgid(0, 0)), so a point reached in a Python worker (executor
        # tasks, and the streaming writer's commit in pyspark 4) must also kill the group of
        # the session leader: the pipeline's driver and JVM, started by the harness with
        # start_new_session. The session id is that leader's pid and group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(0) != os.getpgrp():
                os.killpg(os.getsid(0), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def pause_paths(spec_key: str, directory: str | None = None) -> tuple[str, str]:
    """The ``.reached`` and ``.go`` files of a ``pause`` spec (``FailpointSpec.key``)."""
    where = directory or os.environ.get(ENV_PAUSE_DIR) or "."
    base = os.path.join(where, spec_key.replace("/", "_"))
    return base + ".reached", base + ".go"


def _pause(spec: FailpointSpec, message: str) -> None:
    import time

    reached, go = pause_paths(spec.key)
    log.warning("%s: paused until %s exists", message, go)
    with open(reached, "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_LIMIT
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
