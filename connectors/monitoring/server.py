"""``serve(spark, port=...)``: the metrics endpoint in the driver (docs/monitoring.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.metrics_core import Metric

from connectors.monitoring import channel, metrics

log = logging.getLogger(__name__)


class _DrainingRegistry:
    """The metrics registry as the endpoint sees it: each scrape first applies what the
    sinks' worker processes spooled since the last one, so a scrape is never a batch late."""

    def __init__(self, spool: channel.Spool | None) -> None:
        self.spool = spool

    def collect(self) -> Iterable[Metric]:
        _drain(self.spool)
        return metrics.REGISTRY.collect()

    def restricted_registry(self, names: Iterable[str]) -> Any:
        _drain(self.spool)
        return metrics.REGISTRY.restricted_registry(names)


def _drain(spool: channel.Spool | None) -> None:
    """Apply what the sinks' worker processes spooled; a failure is counted and logged, and
    what there is gets served."""
    if spool is None:
        return
    try:
        spool.drain()
    except Exception:  # noqa: BLE001 - serve what there is
        metrics.METRIC_ERRORS.labels("spool").inc()
        log.warning("metrics: could not read the spool", exc_info=True)


@dataclass
class MetricsServer:
    """A running endpoint: ``url`` to scrape, ``stop()`` to end it and the listener."""

    host: str
    port: int
    _httpd: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _spark: Any = field(repr=False, default=None)
    _listener: Any = field(repr=False, default=None)
    _spool: channel.Spool | None = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def drain(self) -> None:
        """Apply what the sinks spooled (a scrape does this too)."""
        _drain(self._spool)

    def stop(self) -> None:
        channel.serving(None)
        if self._spark is not None and self._listener is not None:
            try:
                self._spark.streams.removeListener(self._listener)
            except Exception:  # noqa: BLE001 - a stopped session has no listeners left
                log.debug("could not remove the metrics listener", exc_info=True)
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        if self._spool is not None:
            self._spool.remove()


def serve(spark: Any = None, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Start the Prometheus endpoint in this (driver) process and feed it.

    - ``spark``: a classic ``SparkSession``, whose queries' progress the endpoint reports
      (a ``StreamingQueryListener``) and whose JVM's sink workers spool their commit counts
      here (:mod:`connectors.monitoring.channel`). ``None``: only the commits of this process
      (``foreachBatch``, ``sink.write``).
    - ``port``: 0 picks a free one (read it from the result's ``port`` / ``url``).
    - ``host``: the address to listen on; the default serves this host only.
    """
    spool = None
    listener = None
    if spark is not None:
        jvm_pid = _jvm_pid(spark)
        if jvm_pid is not None:
            spool = channel.Spool.create(jvm_pid, metrics.apply_event)
    channel.serving(metrics.apply_event)
    httpd, thread = start_http_server(port, addr=host, registry=_DrainingRegistry(spool))
    bound = int(httpd.server_address[1])
    if spark is not None:
        from connectors.monitoring.listener import MetricsListener

        listener = MetricsListener(before=lambda: _drain(spool))
        spark.streams.addListener(listener)
    log.info("metrics: serving http://%s:%d/metrics", host, bound)
    return MetricsServer(host, bound, httpd, thread, spark, listener, spool)


def _jvm_pid(spark: Any) -> int | None:
    """The driver JVM's pid (a classic session); None for Spark Connect, whose sinks commit
    on the server."""
    jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None) if not _is_connect(
        spark) else None
    if jvm is None:
        return None
    return int(jvm.java.lang.ProcessHandle.current().pid())


def _is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
