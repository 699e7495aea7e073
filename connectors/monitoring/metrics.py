"""The exported metrics (docs/monitoring.md lists each with its meaning, unit and labels).

One private :class:`prometheus_client.CollectorRegistry`, so nothing of the process's default
registry (or another library's) leaks into the endpoint. Names follow Prometheus' conventions:
the ``eo_`` prefix, base units (seconds, bytes), ``_total`` on counters.

Two feeds fill them, both on the driver:

- :func:`apply_progress`: Spark's ``StreamingQueryProgress`` (as JSON), from the listener
  ``serve`` registers: per query and per source.
- :func:`apply_event`: the sinks' own commit events (:mod:`connectors.monitoring.channel`),
  built on the driver from the COMMITTED messages of a batch, so a retried or zombie task
  counts once, for the attempt that won.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from connectors.core.storage import request_counts, stats
from connectors.monitoring import channel

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

QUERY = ("query_id", "query_name")
SOURCE = (*QUERY, "source")
SINK = ("family", "sink_id")

#: Batch and step durations: 5 ms to 10 min.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0)

# -- Spark's progress, per query ---------------------------------------------------------------
QUERY_BATCHES = Counter("eo_query_batches_total",
                        "Micro-batches the query completed (progress events with rows or not)",
                        QUERY, registry=REGISTRY)
QUERY_INPUT_ROWS = Counter("eo_query_input_rows_total",
                           "Rows the query read, summed over its sources (numInputRows)",
                           QUERY, registry=REGISTRY)
QUERY_BATCH_DURATION = Histogram("eo_query_batch_duration_seconds",
                                 "Wall time of one micro-batch (durationMs.triggerExecution)",
                                 QUERY, buckets=DURATION_BUCKETS, registry=REGISTRY)
QUERY_LAST_BATCH = Gauge("eo_query_last_batch_id",
                         "Spark's batch id of the last micro-batch that ran (its progress "
                         "event); while the query is idle Spark's lastProgress names the next "
                         "batch, one higher, which has not run", QUERY, registry=REGISTRY)
QUERY_LAST_PROGRESS = Gauge("eo_query_last_progress_timestamp_seconds",
                            "When the last progress event arrived (Unix time)",
                            QUERY, registry=REGISTRY)
QUERY_ACTIVE = Gauge("eo_query_active", "1 while the query runs in this driver, 0 after it ended",
                     QUERY, registry=REGISTRY)
QUERY_FAILED = Counter("eo_query_failures_total",
                       "Queries of this driver that terminated with an exception",
                       QUERY, registry=REGISTRY)

# -- per source (Spark's SourceProgress) --------------------------------------------------------
SOURCE_INPUT_ROWS = Counter("eo_source_input_rows_total", "Rows read from this source",
                            SOURCE, registry=REGISTRY)
SOURCE_BEHIND = Gauge("eo_source_offsets_behind_latest",
                      "Offsets between the end of the last batch and the latest offset the "
                      "source reported (reportLatestOffset), per topic partition",
                      (*SOURCE, "topic", "partition"), registry=REGISTRY)
SOURCE_BEHIND_STAT = {
    stat: Gauge(f"eo_source_offsets_behind_latest_{stat}",
                f"{stat} over partitions of eo_source_offsets_behind_latest "
                f"(Spark's {stat}OffsetsBehindLatest)", SOURCE, registry=REGISTRY)
    for stat in ("min", "avg", "max")
}

# -- per sink: the committed messages (channel events) ------------------------------------------
SINK_BATCHES = Counter("eo_sink_batches_committed_total", "Batches this sink committed",
                       SINK, registry=REGISTRY)
SINK_ROWS = Counter("eo_sink_rows_committed_total",
                    "Rows of committed batches (each once, whatever the attempts)",
                    SINK, registry=REGISTRY)
SINK_BYTES = Counter("eo_sink_bytes_committed_total",
                     "Bytes of committed output (sinks that know it: eo_files)",
                     SINK, registry=REGISTRY)
SINK_PRODUCED = Counter("eo_sink_records_produced_total",
                        "Records the winning attempts sent to Kafka (eo_kafka sink)",
                        SINK, registry=REGISTRY)
SINK_SKIPPED_ROWS = Counter("eo_sink_rows_skipped_total",
                            "Rows a retried task skipped because an earlier attempt had "
                            "already written them (eo_kafka sink recovery keys/commit facts)",
                            SINK, registry=REGISTRY)
SINK_REPLAYS = Counter("eo_sink_replays_skipped_total",
                       "Commits of a batch that was already committed: a replay, no-op",
                       SINK, registry=REGISTRY)
SINK_RETRIED_TASKS = Counter("eo_sink_retried_tasks_total",
                             "Winning task attempts that were retries of a failed or fenced "
                             "attempt (eo_kafka sink)", SINK, registry=REGISTRY)
SINK_SCANS = Counter("eo_sink_recovery_scans_total",
                     "Recovery scans run by retried tasks (eo_kafka sink, recovery keys)",
                     SINK, registry=REGISTRY)
SINK_SCAN_RECORDS = Counter("eo_sink_recovery_scan_records_total",
                            "Records read by recovery scans", SINK, registry=REGISTRY)
SINK_SCAN_SECONDS = Counter("eo_sink_recovery_scan_seconds_total",
                            "Time spent in recovery scans, summed over tasks",
                            SINK, registry=REGISTRY)
SINK_FAILED_ATTEMPTS = Counter("eo_sink_failed_attempts_total",
                               "Task attempts that failed or were superseded before the attempt "
                               "that committed (Spark's attemptNumber of the winning attempts, "
                               "summed); never counted as output", SINK, registry=REGISTRY)
SINK_FENCED = Counter("eo_sink_fenced_attempts_total",
                      "Earlier attempts of a task whose transaction had not committed when the "
                      "winning attempt's init_transactions fenced them (eo_kafka sink, "
                      "transactional=true)", SINK, registry=REGISTRY)
SINK_TXN_ABORTED = Counter("eo_sink_transactions_aborted_total",
                           "Transactions a failing task attempt aborted itself (eo_kafka sink, "
                           "transactional=true; counted in the attempt's process)",
                           SINK, registry=REGISTRY)
SINK_BATCHES_ABORTED = Counter("eo_sink_batches_aborted_total",
                               "Batches whose write job the driver aborted (a task failed for "
                               "good, or the commit failed); the batch runs again",
                               SINK, registry=REGISTRY)
SINK_STEP = Histogram("eo_sink_step_seconds",
                      "Time of one step of a committed batch: stage (slowest task), produce "
                      "(slowest flush), txn_commit (slowest transaction commit), commit (driver)",
                      (*SINK, "step"), buckets=DURATION_BUCKETS, registry=REGISTRY)
SINK_LAST_BATCH = Gauge("eo_sink_last_committed_batch_id", "The sink's last committed batch id",
                        SINK, registry=REGISTRY)
SINK_LAST_COMMIT = Gauge("eo_sink_last_commit_timestamp_seconds",
                         "When the sink last committed a batch (Unix time)",
                         SINK, registry=REGISTRY)

# -- the eo_kafka source's window commits (channel events) --------------------------------------
SOURCE_COMMIT = Histogram("eo_source_window_commit_seconds",
                          "Time of one window commit of an eo_kafka source: the WAL's commit "
                          "marker, the consumer group's commit, the WAL's retention",
                          ("wal_path",), buckets=DURATION_BUCKETS, registry=REGISTRY)
SOURCE_COMMITS = Counter("eo_source_windows_committed_total",
                         "Windows an eo_kafka source committed", ("wal_path",),
                         registry=REGISTRY)
SOURCE_WAL_FILES = Gauge("eo_source_wal_files",
                         "Files in the source's window WAL (records and commit markers), as "
                         "its last retention run listed them", ("wal_path",), registry=REGISTRY)

# -- the metrics themselves ---------------------------------------------------------------------
METRIC_ERRORS = Counter("eo_metrics_errors_total",
                        "Metric updates that failed (never fails a batch; see the log)",
                        ("where",), registry=REGISTRY)

#: Per sink event fields counted as they are (event field -> counter).
_SINK_COUNTS = {
    "rows": SINK_ROWS,
    "bytes": SINK_BYTES,
    "produced": SINK_PRODUCED,
    "skipped_rows": SINK_SKIPPED_ROWS,
    "retried_tasks": SINK_RETRIED_TASKS,
    "scans": SINK_SCANS,
    "scan_records": SINK_SCAN_RECORDS,
    "scan_seconds": SINK_SCAN_SECONDS,
    "failed_attempts": SINK_FAILED_ATTEMPTS,
    "fenced": SINK_FENCED,
    "transactions_aborted": SINK_TXN_ABORTED,
}

#: The newest storage totals of each spooling process (``channel.process_token``), and when
#: each last sent them.
_PEER_STORAGE: dict[str, dict[tuple[str, str, str], int]] = {}
_PEER_SEEN: dict[str, float] = {}
#: The summed totals of processes that are gone: their counts stay in the counters (which
#: must never go down) without an entry per process, so a driver whose Python workers come
#: and go for months keeps one entry per live worker.
_RETIRED: dict[tuple[str, str, str], int] = {}
#: A process that is gone and sent nothing for this long has nothing left to send: its spool
#: file was read to its end and removed (``channel.Spool.drain``) a minute after it ended.
RETIRE_AFTER_S = 300.0


def retire_gone_peers(now: float | None = None) -> int:
    """Fold the totals of spooling processes that ended into :data:`_RETIRED`; returns how
    many were retired."""
    now = time.time() if now is None else now
    retired = 0
    for token, seen in list(_PEER_SEEN.items()):
        pid = token.split("-", 1)[0]
        if now - seen < RETIRE_AFTER_S or (pid.isdigit() and channel.alive(int(pid))):
            continue
        for key, n in _PEER_STORAGE.pop(token, {}).items():
            _RETIRED[key] = _RETIRED.get(key, 0) + n
        del _PEER_SEEN[token]
        retired += 1
    return retired


class StorageCollector:
    """``eo_storage_*``: this process's storage counts (:mod:`connectors.core.storage.stats`)
    plus the newest totals each spooling worker process sent, read at every scrape."""

    def collect(self) -> list[Metric]:
        retire_gone_peers()
        totals: dict[tuple[str, str, str], int] = dict(stats.snapshot())
        for peer in [_RETIRED, *_PEER_STORAGE.values()]:
            for key, n in peer.items():
                totals[key] = totals.get(key, 0) + n
        families = {
            stats.OPERATIONS: CounterMetricFamily(
                "eo_storage_operations", "Storage operations run through the retry budget",
                labels=("store", "op")),
            stats.RETRIES: CounterMetricFamily(
                "eo_storage_retries", "Retries of storage operations after a transient error",
                labels=("store", "op")),
            stats.CONFLICTS: CounterMetricFamily(
                "eo_storage_create_conflicts",
                "Conditional creates that found the name taken (the protocol's answer "
                "'already there', not a failure)", labels=("store", "op")),
        }
        for (what, store, op), n in sorted(totals.items()):
            if what in families:
                families[what].add_metric((store, op), n)
        requests = CounterMetricFamily(
            "eo_storage_object_requests", "HTTP requests to object stores, per kind, of this "
            "process (obstore retries within a request are not seen)", labels=("kind",))
        for kind, n in sorted(request_counts().items()):
            requests.add_metric((kind,), n)
        return [*families.values(), requests]


REGISTRY.register(StorageCollector())  # type: ignore[arg-type]


def apply_event(event: Mapping[str, Any]) -> None:
    """One sink event (:func:`connectors.monitoring.channel.commit_event`) into the metrics."""
    storage = event.get("storage")
    if storage and event.get("process"):
        _PEER_STORAGE[str(event["process"])] = {
            (str(what), str(store), str(op)): int(n) for what, store, op, n in storage}
        _PEER_SEEN[str(event["process"])] = time.time()
    kind = event["kind"]
    if kind == "storage":
        return
    if kind == "source":
        apply_source(event)
        return
    labels = (str(event["family"]), str(event["sink_id"]))
    if kind == "replay":
        SINK_REPLAYS.labels(*labels).inc()
        return
    if kind == "abort":
        SINK_BATCHES_ABORTED.labels(*labels).inc()
        return
    if kind == "count":
        add_counts(labels, event)
        return
    SINK_BATCHES.labels(*labels).inc()
    add_counts(labels, event)
    for step, seconds in (event.get("steps") or {}).items():
        SINK_STEP.labels(*labels, step).observe(float(seconds))
    SINK_LAST_BATCH.labels(*labels).set(int(event["batch_id"]))
    SINK_LAST_COMMIT.labels(*labels).set(float(event["ts"]))


def add_counts(labels: tuple[str, str], event: Mapping[str, Any]) -> None:
    for name, counter in _SINK_COUNTS.items():
        value = event.get(name)
        if value:
            counter.labels(*labels).inc(float(value))


def apply_source(event: Mapping[str, Any]) -> None:
    """One window commit of an eo_kafka source (``channel.source_event``)."""
    wal_path = str(event.get("wal_path") or "")
    SOURCE_COMMITS.labels(wal_path).inc()
    SOURCE_COMMIT.labels(wal_path).observe(float(event["commit_seconds"]))
    if event.get("wal_files") is not None:
        SOURCE_WAL_FILES.labels(wal_path).set(int(event["wal_files"]))


def apply_progress(progress: Mapping[str, Any], now: float) -> None:
    """One ``StreamingQueryProgress`` (its JSON as a dict) into the query and source metrics."""
    query = (str(progress.get("id")), str(progress.get("name") or ""))
    QUERY_ACTIVE.labels(*query).set(1)
    QUERY_BATCHES.labels(*query).inc()
    QUERY_INPUT_ROWS.labels(*query).inc(max(0, int(progress.get("numInputRows") or 0)))
    QUERY_LAST_BATCH.labels(*query).set(int(progress.get("batchId", -1)))
    QUERY_LAST_PROGRESS.labels(*query).set(now)
    duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
    if duration_ms is not None:
        QUERY_BATCH_DURATION.labels(*query).observe(float(duration_ms) / 1000.0)
    for source in progress.get("sources") or ():
        labels = (*query, str(source.get("description", "")))
        SOURCE_INPUT_ROWS.labels(*labels).inc(max(0, int(source.get("numInputRows") or 0)))
        behind = offsets_behind(source.get("endOffset"), source.get("latestOffset"))
        if not behind:
            continue
        for (topic, partition), n in behind.items():
            SOURCE_BEHIND.labels(*labels, topic, partition).set(n)
        values = list(behind.values())
        SOURCE_BEHIND_STAT["min"].labels(*labels).set(min(values))
        SOURCE_BEHIND_STAT["max"].labels(*labels).set(max(values))
        SOURCE_BEHIND_STAT["avg"].labels(*labels).set(sum(values) / len(values))


def query_ended(query_id: str, query_name: str, failed: bool) -> None:
    QUERY_ACTIVE.labels(query_id, query_name).set(0)
    if failed:
        QUERY_FAILED.labels(query_id, query_name).inc()


def offsets_behind(end: Any, latest: Any) -> dict[tuple[str, str], int]:
    """Per (topic, partition): ``latest - end``, from Kafka-style offsets as Spark shows
    them in a progress (``{"topic": {"0": 42}}``, as JSON text or already parsed; eo_kafka's
    multi-cluster form nests one level deeper, ``{"cluster": {"topic": {...}}}``, and is
    flattened to ``cluster/topic``). Anything else (another source's offsets): empty."""
    end_map, latest_map = _partition_offsets(end), _partition_offsets(latest)
    return {tp: max(0, latest_map[tp] - off) for tp, off in end_map.items() if tp in latest_map}


def _partition_offsets(value: Any) -> dict[tuple[str, str], int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    out: dict[tuple[str, str], int] = {}
    if not isinstance(value, Mapping):
        return out
    for topic, parts in value.items():
        if not isinstance(parts, Mapping):
            continue
        for partition, offset in parts.items():
            if isinstance(offset, Mapping):  # multi-cluster: cluster -> topic -> partition
                for p, o in offset.items():
                    if isinstance(o, int) and not isinstance(o, bool):
                        out[(f"{topic}/{partition}", str(p))] = o
            elif isinstance(offset, int) and not isinstance(offset, bool):
                out[(str(topic), str(partition))] = offset
    return out
