"""Where librdkafka's own log lines go: Python logging at DEBUG.

librdkafka repeats every failed connection attempt (thousands of lines against an unreachable
broker). Every client the connectors create passes ``logger=LIBRDKAFKA_LOG``, so those lines
reach Python logging as DEBUG records of ``connectors.kafka.librdkafka`` and stay out of the
user's console; our own errors say what broke.
"""

from __future__ import annotations

import logging


class _Quiet(logging.Filter):
    """Demote every librdkafka record to DEBUG (shown only when that logger enables it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


LIBRDKAFKA_LOG = logging.getLogger("connectors.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_Quiet())
