"""``eo-connectors metrics``: what the sinks' state and the brokers show, without a running
query (docs/monitoring.md, "The same without a running query").

- ``--jdbc-url URL`` (``--table``, ``--sink-id``): each ``eo_jdbc`` sink's last committed
  batch and its age, from the commit table (``jdbc/admin.status``, read-only);
- ``--wal-path P`` (repeatable): an ``eo_kafka`` sink's walPath or an ``eo_files`` output
  path: the last committed batch of its commit log and its age;
- ``--bootstrap B --group G`` (``--topic``): the group's lag per partition (the ``lag``
  command's lookup).

It prints the numbers once, or with ``--serve PORT`` serves them in Prometheus' text
format, read again on every scrape, until interrupted. It only reads: no file, table, topic
or group offset is written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from connectors import cli_kafka
from connectors.core.errors import ConnectorError
from connectors.core.options import redact_url

Storage = Callable[[argparse.Namespace, str], tuple[Any, str]]
HELP = ("last committed batch per sink and its age, a group's lag; --serve PORT exposes them "
        "to Prometheus (read-only)")


def run(args: argparse.Namespace, storage: Storage,
        emit: Callable[[argparse.Namespace, Any, list[str]], None]) -> int:
    """The command: print once, or serve until interrupted."""
    if args.serve is None:
        doc = collect(args, storage)
        emit(args, doc, lines(doc))
        return 0
    httpd, port = serve(args, storage)
    print(f"serving http://{args.host}:{port}/metrics (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    finally:
        httpd.shutdown()
    return 0


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--jdbc-url", help="eo_jdbc: SQLAlchemy URL of the target database")
    sp.add_argument("--table", default="eo_sink_commits", help="eo_jdbc: the commit table "
                    "(default: %(default)s)")
    sp.add_argument("--sink-id", help="eo_jdbc: only this sink")
    sp.add_argument("--wal-path", action="append", metavar="PATH",
                    help="an eo_kafka sink's walPath or an eo_files output path (repeatable)")
    sp.add_argument("--bootstrap", help="with --group: bootstrap servers, host:port[,...]")
    sp.add_argument("--group", help="the consumer group whose lag to show (an eo_kafka "
                    "source's kafka.group.id)")
    sp.add_argument("--topic", help="with --group: only this topic")
    sp.add_argument("--timeout", type=float, default=15.0, help="seconds each Kafka lookup "
                    "may take (default: %(default)s)")
    sp.add_argument("--kafka", action="append", metavar="KEY=VALUE",
                    help="a librdkafka setting (repeatable), see docs/security.md")
    sp.add_argument("--kafka-config", metavar="FILE", help="a file of KEY=VALUE settings")
    sp.add_argument("--serve", type=int, metavar="PORT", help="serve the numbers in "
                    "Prometheus' text format on this port (read again on every scrape) until "
                    "interrupted")
    sp.add_argument("--host", default="127.0.0.1", help="with --serve: the address to listen "
                    "on (default: %(default)s)")


def collect(args: argparse.Namespace, storage: Storage,
            now: float | None = None) -> dict[str, Any]:
    """``{"sinks": [...], "lag": {...} or None}``, read now."""
    if not (args.jdbc_url or args.wal_path or args.group):
        raise ConnectorError("metrics: give what to read: --jdbc-url URL, --wal-path PATH "
                             "(repeatable), and/or --bootstrap B --group G")
    if args.group and not args.bootstrap:
        raise ConnectorError("metrics: --group needs --bootstrap")
    now = time.time() if now is None else now
    sinks: list[dict[str, Any]] = []
    if args.jdbc_url:
        from connectors.jdbc import admin

        for s in admin.status(args.jdbc_url, args.table, args.sink_id):
            at = _unix(s["committed_at"])
            last = s["batch_id"] if s["batch_id"] >= 0 and s["reset_after"] is None else None
            sinks.append({"family": "eo_jdbc", "sink_id": s["sink_id"], "last_batch": last,
                          "committed_at": at if last is not None else None,
                          "where": redact_url(args.jdbc_url)})
    for path in args.wal_path or ():
        sinks.append(_wal_sink(storage, args, path))
    for s in sinks:
        at = s["committed_at"]
        s["age_seconds"] = None if at is None else round(max(0.0, now - at), 3)
    lag = cli_kafka.lag(args)[0] if args.group else None
    return {"sinks": sinks, "lag": lag}


def _wal_sink(storage: Storage, args: argparse.Namespace, path: str) -> dict[str, Any]:
    from connectors import state_report as report
    from connectors.core.wal import WriteAheadLog

    backend, root = storage(args, path)
    found_root, kinds = report.find_logs(backend, root)
    logs = [k for k in kinds if k in report.SINK_LOGS]
    if not logs:
        raise ConnectorError(f"metrics: {path!r} holds no sink commit log (found "
                             f"{kinds or 'nothing'}): give an eo_kafka sink's walPath or an "
                             "eo_files output path")
    kind = logs[0]
    wal = WriteAheadLog(backend, found_root, kind)
    last = wal.last_committed()
    info = (wal.commit_info(last) or {}) if last is not None else {}
    ms = info.get("committed_ms")
    return {"family": "eo_kafka" if kind == "commits" else "eo_files",
            "sink_id": str(info.get("sink_id") or ""), "last_batch": last,
            "committed_at": ms / 1000.0 if isinstance(ms, (int, float)) else None,
            "where": backend.url(found_root)}


def _unix(value: Any) -> float | None:
    """The commit table's naive-UTC ``committed_at`` (a datetime, or text on SQLite)."""
    if isinstance(value, str):
        value = _dt.datetime.fromisoformat(value)
    if not isinstance(value, _dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.timestamp()


def lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for s in doc["sinks"]:
        name = f"{s['family']} {s['sink_id'] or '(no sink_id)'} at {s['where']}"
        if s["last_batch"] is None:
            out.append(f"{name}: nothing committed yet")
        else:
            age = "" if s["age_seconds"] is None else f", {s['age_seconds']:.0f} s ago"
            out.append(f"{name}: last committed batch {s['last_batch']}{age}")
    if doc["lag"] is not None:
        lag = doc["lag"]
        out.append(f"group {lag['group']}: total lag {lag['total_lag']}")
        out += [f"  {p['topic']}[{p['partition']}] lag {p['lag']}" for p in lag["partitions"]]
    return out


class _Collector:
    """Reads the state on every scrape; a failed read is a scrape error, not a crash."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        doc = self.read()
        batch = GaugeMetricFamily("eo_sink_last_committed_batch_id",
                                  "The sink's last committed batch id",
                                  labels=["family", "sink_id"])
        at = GaugeMetricFamily("eo_sink_last_commit_timestamp_seconds",
                               "When the sink last committed a batch (Unix time)",
                               labels=["family", "sink_id"])
        for s in doc["sinks"]:
            if s["last_batch"] is not None:
                batch.add_metric([s["family"], s["sink_id"]], s["last_batch"])
            if s["committed_at"] is not None:
                at.add_metric([s["family"], s["sink_id"]], s["committed_at"])
        lag = GaugeMetricFamily("eo_group_lag", "A consumer group's lag per partition "
                                "(end offset minus committed offset)",
                                labels=["group", "topic", "partition"])
        if doc["lag"] is not None:
            for p in doc["lag"]["partitions"]:
                if p["lag"] is not None:
                    lag.add_metric([doc["lag"]["group"], p["topic"], str(p["partition"])],
                                   p["lag"])
        return [batch, at, lag]


def serve(args: argparse.Namespace, storage: Storage) -> tuple[Any, int]:
    """Start the endpoint (a daemon thread); returns ``(server, port)``."""
    from prometheus_client import start_http_server

    collect(args, storage)  # a wrong argument fails now, not at the first scrape
    httpd, _ = start_http_server(args.serve, addr=args.host,
                                 registry=_Collector(lambda: collect(args, storage)))
    return httpd, int(httpd.server_address[1])
