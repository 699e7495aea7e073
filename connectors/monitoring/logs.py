"""JSON log lines (docs/monitoring.md, "Structured logs"): one JSON object per record, with
the context an operator filters on (query id, batch id, sink id, attempt, step) and never a
secret.

``enable_json_logs()`` puts :class:`JsonFormatter` on the ``connectors`` logger (or the one
named). The context comes from ``extra=`` of a logging call, or from :func:`log_context`,
which sets it for everything logged inside its block (a ``contextvars`` context: per thread
and per asyncio task)::

    with log_context(query_id=str(query.id), sink_id="orders"):
        ...

Secrets: the message and every string field go through
:func:`connectors.core.secrets.scrub_known` (values a redacted configuration of this process
held) and URLs through :func:`connectors.core.secrets.redact_url`; a field whose name
:func:`connectors.core.secrets.is_secret` is dropped to ``***``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from connectors.core.secrets import REDACTED, is_secret, redact_url, scrub_known

#: The context fields, in the order they are written.
FIELDS = ("query_id", "batch_id", "sink_id", "attempt", "step")

_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar(
    "eo_log_context", default={})  # noqa: B039 - never mutated, replaced whole
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.I)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (``query_id``, ``batch_id``, ``sink_id``, ``attempt``, ``step`` or any
    other) to every record logged inside the block."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _URL.sub(lambda m: redact_url(m.group(0)), scrub_known(value))
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _clean(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (Unix seconds), ``level``, ``logger``, ``message``,
    the context fields that are set, and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": _clean(record.getMessage()),
        }
        context = {**_context.get()}
        for name in FIELDS:
            if hasattr(record, name):
                context[name] = getattr(record, name)
        for name, value in context.items():
            out[name] = REDACTED if is_secret(name) else _clean(value)
        if record.exc_info:
            out["exception"] = _clean(self.formatException(record.exc_info))
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def enable_json_logs(logger: str = "connectors", level: int | str = logging.INFO,
                     stream: IO[str] | None = None) -> logging.Handler:
    """Write ``logger``'s records (default: all of the connectors') as JSON lines to
    ``stream`` (default stderr); returns the handler, to remove it again."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    target = logging.getLogger(logger)
    target.addHandler(handler)
    target.setLevel(level)
    target.propagate = False  # once, as JSON, not again through the root's text handler
    return handler
