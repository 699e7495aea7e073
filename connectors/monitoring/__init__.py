"""Metrics of the connectors, in Prometheus' text format (docs/monitoring.md).

``connectors.monitoring.serve(spark, port=...)`` starts the endpoint in the driver; the
metrics are in :mod:`.metrics`, the way sink workers' counts reach it in :mod:`.channel`,
JSON log lines in :mod:`.logs`. ``serve`` is imported on first use: the sinks import
:mod:`.channel` in every worker, which needs no ``prometheus_client``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connectors.monitoring.server import MetricsServer, serve


def __getattr__(name: str) -> Any:
    if name in ("serve", "MetricsServer"):
        from connectors.monitoring import server

        return getattr(server, name)
    raise AttributeError(name)


__all__ = ["MetricsServer", "serve"]
