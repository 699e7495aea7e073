"""A ``StreamingQueryListener`` that feeds Spark's progress into the connectors' metrics
(:func:`connectors.monitoring.metrics.apply_progress`), and drains the sinks' spool first so
a batch's sink counts and its progress arrive together. Runs in the driver; a failure is
logged and counted, never raised into Spark's listener bus."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from connectors.monitoring import metrics

log = logging.getLogger(__name__)


class MetricsListener(StreamingQueryListener):
    """Progress events -> ``eo_query_*`` and ``eo_source_*`` metrics."""

    def __init__(self, before: Callable[[], Any] | None = None) -> None:
        self.before = before
        self.names: dict[str, str] = {}

    def _guarded(self, where: str, fn: Callable[[], None]) -> None:
        try:
            if self.before is not None:
                self.before()
            fn()
        except Exception:  # noqa: BLE001 - metrics never fail a query
            metrics.METRIC_ERRORS.labels(where).inc()
            log.warning("metrics: could not record a %s event", where, exc_info=True)

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        def started() -> None:
            name = event.name or ""
            self.names[str(event.id)] = name
            metrics.QUERY_ACTIVE.labels(str(event.id), name).set(1)

        self._guarded("query_started", started)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        self.progress_json(event.progress.json)

    def progress_json(self, text: str) -> None:
        self._guarded("query_progress", lambda: metrics.apply_progress(json.loads(text),
                                                                         time.time()))

    @property
    def _jlistener(self) -> Any:
        """What Spark's listener bus calls (classic pyspark): :class:`_ProgressAsJson`."""
        found = self.__dict__.get("_jlistenerobj")
        if found is None:
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm
            found = jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
            self.__dict__["_jlistenerobj"] = found
        return found

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        query_id = str(event.id)
        self._guarded("query_terminated", lambda: metrics.query_ended(
            query_id, self.names.get(query_id, ""), event.exception is not None))


class _ProgressAsJson(JStreamingQueryListener):
    """pyspark's bridge from the JVM's listener bus, but a progress event is read as its JSON
    (two Py4J calls) instead of pyspark's ``StreamingQueryProgress.fromJObject`` (a Py4J
    call per field, source and sink: dozens per micro-batch, on the driver's cores the
    query uses too); the JSON is all :func:`~connectors.monitoring.metrics.apply_progress`
    reads."""

    pylistener: MetricsListener

    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.progress_json(jevent.progress().json())
