"""A week in an hour: thousands of micro-batches of the four sinks in one driver, with a
driver restart and a broker restart on the way, sampling every resource that could grow.

    python bench/endurance.py                          # the full run: 60 min, restarts
    python bench/endurance.py --rows 1000 --minutes 8 --interval 5 --no-restarts --check

One driver (bench/_endurance_app.py) runs the ``eo_kafka`` source into the four sinks:
``eo_kafka`` with recovery keys, ``eo_kafka`` transactional, ``eo_jdbc`` accumulating on
PostgreSQL (after a shuffle), ``eo_files`` Parquet, each query at
``trigger(processingTime="0 seconds")`` with at most ``--per-batch`` records per batch. A
producer thread here keeps a small backlog ahead of the slowest query. The run lasts
``--minutes`` or until every query committed ``--rows`` micro-batches, whichever comes first;
the driver is SIGKILLed (its whole process group: driver, JVM, Python workers) and started
again at ``--driver-restart-at`` minutes, the broker stopped and started again at
``--broker-restart-at`` (the producer paused meanwhile, so the ground truth stays exact).

Every ``--interval`` seconds it samples (see :data:`SERIES`):

- RSS, threads and open descriptors of the driver, its JVM and every Python worker (from
  ``/proc``), and how many workers there are;
- files and bytes the app's processes made in their temporary directory (``TMPDIR``,
  ``java.io.tmpdir`` and ``spark.local.dir`` all point there), the metrics spool (inside
  it), the checkpoints, every ``walPath`` (the four source WALs, the two Kafka sinks' commit
  logs and started markers), the file sink's ``_eo_log``, ``_eo_staging`` and
  ``_spark_metadata``;
- PostgreSQL: the sink's connections (``application_name``), its row in the commit table,
  size and dead tuples of the staging table, the target and the commit table;
- Kafka: connections to the broker (our processes' sockets, and every established one on
  the broker's port), consumer groups, the sinks' commit-fact groups, transactional ids
  (Kafka's ``TransactionsCommand list``);
- the series the metrics endpoint serves.

Each series' growth per 1,000 batches is the slope of a least-squares line through the
samples after warm-up (the first ``--warmup`` batches of the run, and ``--settle`` batches
after each restart), one line per stretch between restarts with a common slope. At the end
the producer stops, the queries drain, the app stops, and every sink is checked exact
against what was produced (Kafka read ``read_committed``, the table's counts, the committed
Parquet files). It prints the table, draws the series against batches into ``--png``
(``bench/results/endurance.png``) and ends with its RESULT line (bench/README.md).
``--check`` (the CI test, tests/integration/test_endurance.py) exits 1 when a series that
must stay flat grew past its tolerance, a WAL kept more files than its retention allows,
an output was not exact or a query terminated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import broker_data_root  # noqa: E402

APP = os.path.join(HERE, "_endurance_app.py")
QUERIES = ("rk", "txn", "jdbc", "files")
PARTITIONS = 2
#: ``spark.sql.streaming.minBatchesToRetain``'s default: batches of a checkpoint Spark keeps
SPARK_MIN_BATCHES_TO_RETAIN = 100
KEYS = 113
DEFAULT_DSN = "postgresql://eo:eo@127.0.0.1:5432/eo_test"
#: Signs in the app's log that a query ended or a process aborted.
TERMINATIONS = ("QUERY FAILED", "terminated with error")
ABORTS = ("Fatal Python error", "core dumped", "Python worker exited unexpectedly", "SIGSEGV",
          "SIGABRT")


@dataclass(frozen=True)
class Series:
    """One sampled figure: ``key`` in a sample, its ``label``, the ``group`` it is drawn in,
    what bounds it, and how it is judged (:func:`verdict`):

    - ``tolerance``: the growth per 1,000 batches after warm-up above which a series that
      must stay flat has grown;
    - ``cap``: for a series that climbs towards a bound (a JVM's heap, a file rotated at a
      size), the most it may reach: ``cap(samples)``;
    - neither: it grows with the output (``output``), or is a sum of series judged one by
      one."""

    key: str
    label: str
    group: str
    bound: str
    tolerance: float | None
    #: ``--check`` fails when the series grew more than this over the measured stretch
    #: (the growth per batch times the batches measured): a short run's own noise, far
    #: below a leak of one item per batch over a hundred batches
    ci: float | None = None
    cap: Callable[[list[dict[str, Any]]], float] | None = None
    output: bool = False


#: The app's ``spark.driver.memory``, and what a JVM holds besides its heap (metaspace, code
#: cache, thread stacks, direct buffers, the allocator's arenas) on this workload.
DRIVER_HEAP_MB = 1024
JVM_OVERHEAD_MB = 768


def _peak(samples: list[dict[str, Any]], key: str) -> float:
    return max((float(s[key]) for s in samples if s.get(key) is not None), default=0.0)


#: Every series, in the table's order. Tolerances are per 1,000 batches after warm-up: far
#: below a leak of one item per batch (1,000), above what workers coming and going and the
#: JVM's thread pools do.
SERIES: tuple[Series, ...] = (
    Series("driver_rss_mb", "driver RSS (MB)", "RSS (MB)", "flat", 3),
    Series("jvm_rss_mb", "JVM RSS (MB)", "RSS (MB)",
           f"the heap's maximum (`spark.driver.memory`, {DRIVER_HEAP_MB} MB here) and what "
           f"a JVM holds besides (metaspace, code cache, stacks): {JVM_OVERHEAD_MB} MB "
           "allowed", None, cap=lambda _: DRIVER_HEAP_MB + JVM_OVERHEAD_MB),
    Series("worker_rss_mb_max", "largest Python worker RSS (MB)", "RSS (MB)", "flat", 3),
    Series("workers_rss_mb", "Python workers' RSS, sum (MB)", "RSS (MB)",
           "the workers' number times each one's RSS", None),
    Series("driver_threads", "driver threads", "threads", "flat", 3, ci=2),
    Series("jvm_threads", "JVM threads", "threads",
           "flat (Spark's and Netty's pools, idle threads end after 60 s)", 15),
    Series("worker_threads_max", "most threads of a Python worker", "threads", "flat", 3,
           ci=3),
    Series("workers_threads", "Python workers' threads, sum", "threads",
           "the workers' number times each one's threads", None),
    Series("driver_fds", "driver open files", "open files", "flat", 5, ci=3),
    Series("jvm_fds", "JVM open files", "open files", "flat", 25, ci=30),
    Series("worker_fds_max", "most open files of a Python worker", "open files", "flat", 5,
           ci=6),
    Series("workers_fds", "Python workers' open files, sum", "open files",
           "the workers' number times each one's open files", None),
    Series("workers", "Python workers", "processes", "flat", 3),
    Series("tmp_files", "files in the app's temp dir", "temp dir",
           "Spark's shuffle files until the driver's GC lets its ContextCleaner remove them "
           "(`spark.cleaner.periodicGC.interval`, 30 min)", 20, ci=20),
    Series("tmp_mb", "MB in the app's temp dir", "temp dir", "as above", 5),
    Series("spool_files", "metrics spool files", "metrics spool",
           "one per live worker; a file past 1 MiB rotated and removed once read", 3, ci=3),
    Series("spool_kb", "metrics spool KB", "metrics spool",
           "1 MiB per spooling worker (`ROTATE_BYTES`)", None,
           cap=lambda samples: 1024 * (_peak(samples, "spool_files") + 1)),
    Series("checkpoint_files", "checkpoint files (4 queries)", "checkpoints",
           "`spark.sql.streaming.minBatchesToRetain` (100) per query", 20),
    Series("checkpoint_kb", "checkpoint KB (4 queries)", "checkpoints", "as above", 100),
    Series("source_wal_files", "source WAL files (4 walPaths)", "walPath files",
           "100 windows + 10 kept per walPath (`WAL_KEEP_WINDOWS`, retention every 10th)",
           10),
    Series("rk_wal_files", "rk sink walPath files", "walPath files",
           "10 commits + 10 (`KEEP_COMMITS`), owner record", 3),
    Series("txn_wal_files", "txn sink walPath files", "walPath files", "as rk", 3),
    Series("started_markers", "started markers (both Kafka sinks)", "walPath files",
           "deleted by each batch's commit (older leftovers every 10th batch)", 3),
    Series("eo_log_files", "file sink _eo_log files", "file sink state",
           "100 commits + 10 (`LOG_RETENTION`)", 10),
    Series("staging_files", "file sink _eo_staging files", "file sink state",
           "swept every 10th batch", 3),
    Series("spark_metadata_files", "file sink _spark_metadata files", "file sink state",
           "a compaction every 10 batches, 100 batches kept (Spark's file sink log)", 10),
    Series("spark_metadata_kb", "file sink _spark_metadata KB", "file sink log size",
           "grows with the output: each compaction lists every file ever committed, as "
           "Spark's own file sink log does", None, output=True),
    Series("data_files", "file sink data files (the output)", "file sink log size",
           "the output", None, output=True),
    Series("pg_connections", "PostgreSQL connections of the sink", "PostgreSQL connections",
           "flat: one pooled engine per process and URL", 2, ci=2),
    Series("pg_sockets", "our sockets to PostgreSQL", "PostgreSQL connections", "flat", 2),
    Series("pg_commit_rows", "commit table rows of the sink", "PostgreSQL rows",
           "one row per sink_id, updated per batch", 0.5, ci=0.5),
    Series("pg_commits_dead", "commit table dead tuples", "PostgreSQL dead tuples",
           "autovacuum (`autovacuum_vacuum_threshold` 50 + 20% of the rows)", 200),
    Series("pg_stage_kb", "staging table KB", "PostgreSQL size (KB)",
           "rows deleted by each commit; space reused after autovacuum", 100),
    Series("pg_stage_dead", "staging table dead tuples", "PostgreSQL dead tuples",
           "autovacuum", 500),
    Series("pg_target_kb", "target table KB", "PostgreSQL size (KB)",
           "113 keys updated per batch: reused after autovacuum", 100),
    Series("pg_target_dead", "target table dead tuples", "PostgreSQL dead tuples",
           "autovacuum", 500),
    Series("kafka_conns", "our connections to the broker", "Kafka connections",
           "flat: cached clients per process", 5, ci=6),
    Series("broker_conns", "every connection on the broker's port", "Kafka connections",
           "flat; a killed client's connection closes at `connections.max.idle.ms` (10 min)",
           10),
    Series("kafka_groups", "consumer groups (all)", "Kafka groups and ids",
           "one per source query and per transactional writer", 0.5),
    Series("fact_groups", "commit-fact groups (eo-sink-*)", "Kafka groups and ids",
           "one per transactional writer partition (`offsets.retention.minutes` once empty)",
           0.5),
    Series("txn_ids", "transactional ids", "Kafka groups and ids",
           "one per writer partition (`transactional.id.expiration.ms`, 7 days, once idle)",
           0.5),
    Series("metric_series", "series on /metrics", "metrics endpoint",
           "flat: labels are queries, sinks, partitions and steps", 5, ci=10),
)
BY_KEY = {s.key: s for s in SERIES}


# -- /proc ------------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _descendants(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _exe(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


@dataclass
class Proc:
    pid: int
    rss_mb: float
    threads: int
    fds: int
    sockets: set[int]


def proc(pid: int) -> Proc | None:
    """What process ``pid`` holds: RSS, threads, open descriptors and its sockets' inodes."""
    status = _read(f"/proc/{pid}/status")
    if not status:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    sockets: set[int] = set()
    fds = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in names:
        fds += 1
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(int(target[8:-1]))
    rss = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
    return Proc(pid, rss, int(fields.get("Threads", "0")), fds, sockets)


def tcp_table() -> dict[int, tuple[int, int, bool]]:
    """Socket inode -> (local port, remote port, established) for TCP over IPv4 and IPv6."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(path).splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10:
                continue
            local = int(cols[1].rsplit(":", 1)[1], 16)
            remote = int(cols[2].rsplit(":", 1)[1], 16)
            out[int(cols[9])] = (local, remote, cols[3] == "01")
    return out


def established_on(port: int) -> int:
    """Established connections whose server side is ``port`` (any client)."""
    return sum(1 for lp, _, est in tcp_table().values() if est and lp == port)


def tree(app_pid: int) -> tuple[Proc | None, Proc | None, list[Proc]]:
    """(driver, its JVM, the JVM's Python workers) of the app whose driver is ``app_pid``."""
    kids = _children()
    driver = proc(app_pid)
    jvms = [p for p in _descendants(app_pid, kids) if _exe(p) == "java"]
    jvm = proc(jvms[0]) if jvms else None
    workers: list[Proc] = []
    if jvms:
        for p in _descendants(jvms[0], kids):
            if _exe(p).startswith("python") and (w := proc(p)) is not None:
                workers.append(w)
    return driver, jvm, workers


def dir_stats(path: str | Path, skip: tuple[str, ...] = ()) -> tuple[int, int]:
    """(files, bytes) under ``path``, recursively; 0s when it does not exist."""
    files = size = 0
    for top, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        for n in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(top, n)).st_size
    return files, size


def files_in(path: str | Path) -> int:
    return dir_stats(path)[0]


# -- the run's moving parts -------------------------------------------------------------------
@dataclass
class Layout:
    """Where one run keeps everything, and the names it uses."""

    work: Path
    run_id: str
    source: str
    rk: str
    txn: str
    table: str

    @property
    def app_work(self) -> Path:
        return self.work / "app"

    @property
    def tmp(self) -> Path:
        return self.work / "tmp"

    @property
    def files(self) -> Path:
        return self.work / "files-out"

    def query(self, name: str) -> Path:
        return self.app_work / name

    def sink_id(self, name: str) -> str:
        return f"endurance-{self.run_id}-{name}"


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches the query committed (its newest commit's id + 1; ids go on across
    restarts)."""
    try:
        ids = [int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit()]
    except OSError:
        return 0
    return max(ids) + 1 if ids else 0


def committed_end(checkpoint: Path, topic: str) -> int:
    """Records of ``topic`` the query has committed: the end offsets of its newest commit."""
    last = committed_batches(checkpoint) - 1
    if last < 0:
        return 0
    lines = _read(str(checkpoint / "offsets" / str(last))).splitlines()
    for line in lines[2:]:
        with contextlib.suppress(ValueError, AttributeError):
            doc = json.loads(line)
            parts = doc.get(topic) if isinstance(doc, dict) else None
            if isinstance(parts, dict):
                return sum(int(v) for v in parts.values())
    return 0


class Load:
    """The producer: records ``v-<i>`` with key ``k<i % 113>`` on partition ``i % 2``, a few
    batches ahead of the slowest query; paused while the broker restarts."""

    def __init__(self, bootstrap: str, layout: Layout, per_batch: int) -> None:
        self.bootstrap, self.layout, self.per_batch = bootstrap, layout, per_batch
        self.sent = 0
        self.failed = 0
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.idle = threading.Event()  # set while paused with nothing in flight
        self.thread = threading.Thread(target=self._run, daemon=True)

    def slowest(self) -> int:
        return min(committed_end(self.layout.query(q) / "checkpoint", self.layout.source)
                   for q in QUERIES)

    def _run(self) -> None:
        from confluent_kafka import Producer

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                self.failed += 1

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "message.timeout.ms": 600000})
        ahead = 3 * self.per_batch
        while not self.stop.is_set():
            if self.paused.is_set():
                producer.flush(60)
                self.idle.set()
                time.sleep(0.2)
                continue
            self.idle.clear()
            if self.sent - self.slowest() < ahead:
                for _ in range(self.per_batch):
                    i = self.sent
                    producer.produce(self.layout.source, key=f"k{i % KEYS}".encode(),
                                     value=f"v-{i:09d}".encode(), partition=i % PARTITIONS,
                                     on_delivery=report)
                    self.sent += 1
            producer.poll(0.05)
        left = producer.flush(120)
        if left:
            self.failed += left

    def pause(self) -> None:
        self.paused.set()
        self.idle.clear()
        self.idle.wait(120)

    def resume(self) -> None:
        self.paused.clear()


class App:
    """The driver process (and its JVM and workers, one process group), restartable."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            out.write(f"\n=== app run {self.runs + 1} ===\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out,  # noqa: S603
                                         stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True)
        self.runs += 1

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Broker:
    """The benchmark's own Apache Kafka (restartable on its port and data), or an external
    one (``--bootstrap``: no restart, no tools)."""

    def __init__(self, bootstrap: str | None, work: Path) -> None:
        self.node: Any = None
        self.external = bootstrap
        self.bootstrap = bootstrap or ""
        self.work = work

    def start(self) -> Broker:
        if self.external:
            return self
        from connectors.demo.services.kafka import ApacheKafka

        root = broker_data_root()
        base = Path(root) if root else self.work
        data = Path(tempfile.mkdtemp(prefix="eo-endurance-kafka-", dir=base))
        self.node = ApacheKafka(workdir=str(data), keep=True).start()
        self.bootstrap = self.node.bootstrap
        return self

    @property
    def port(self) -> int:
        return int(self.bootstrap.split(",")[0].rsplit(":", 1)[1])

    def restart(self) -> None:
        self.node.restart()

    def transactions(self) -> list[str] | None:
        """Kafka's ``TransactionsCommand list``: one line per transactional id (our broker
        only; None when it cannot be asked)."""
        if self.node is None:
            return None
        try:
            out = self.node.tool("org.apache.kafka.tools.TransactionsCommand",
                                 "--bootstrap-server", self.bootstrap, "list", timeout=60)
        except Exception:  # noqa: BLE001 - a sample without it, not a failed run
            return None
        return [line for line in out.splitlines()[1:] if line.strip()]

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
            shutil.rmtree(self.node.workdir, ignore_errors=True)


class Sampler:
    """One sample of every series (:data:`SERIES`) of the run."""

    def __init__(self, layout: Layout, broker: Broker, dsn: str, app: App,
                 txn_every: int) -> None:
        self.layout, self.broker, self.dsn, self.app = layout, broker, dsn, app
        self.txn_every = txn_every
        self.count = 0
        self.last_txn: list[str] | None = None
        self.admin: Any = None

    def batches(self) -> dict[str, int]:
        return {q: committed_batches(self.layout.query(q) / "checkpoint") for q in QUERIES}

    def sample(self) -> dict[str, Any]:
        s: dict[str, Any] = {"t": time.time(), "batches": self.batches()}
        s["x"] = min(s["batches"].values())
        self._processes(s)
        self._files(s)
        with contextlib.suppress(Exception):
            self._postgres(s)
        with contextlib.suppress(Exception):
            self._kafka(s)
        s["metric_series"] = self._metric_series()
        self.count += 1
        return s

    def _processes(self, s: dict[str, Any]) -> None:
        driver, jvm, workers = tree(self.app.pid)
        tcp = tcp_table()
        ours = [p for p in (driver, jvm, *workers) if p is not None]

        def to_port(port: int) -> int:
            return sum(1 for p in ours for i in p.sockets
                       if i in tcp and tcp[i][1] == port and tcp[i][2])

        for name, p in (("driver", driver), ("jvm", jvm)):
            if p is not None:
                s[f"{name}_rss_mb"] = round(p.rss_mb, 1)
                s[f"{name}_threads"] = p.threads
                s[f"{name}_fds"] = p.fds
        s["workers"] = len(workers)
        s["each_worker"] = {w.pid: [round(w.rss_mb, 1), w.threads, w.fds] for w in workers}
        if workers:
            s["workers_rss_mb"] = round(sum(w.rss_mb for w in workers), 1)
            s["worker_rss_mb_max"] = round(max(w.rss_mb for w in workers), 1)
            s["workers_threads"] = sum(w.threads for w in workers)
            s["worker_threads_max"] = max(w.threads for w in workers)
            s["workers_fds"] = sum(w.fds for w in workers)
            s["worker_fds_max"] = max(w.fds for w in workers)
        s["kafka_conns"] = to_port(self.broker.port)
        s["pg_sockets"] = to_port(_pg_port(self.dsn))
        s["broker_conns"] = established_on(self.broker.port)

    def _files(self, s: dict[str, Any]) -> None:
        lay = self.layout
        s["tmp_files"], tmp_bytes = dir_stats(lay.tmp)
        s["tmp_mb"] = round(tmp_bytes / 2**20, 2)
        spool = [p for p in lay.tmp.glob("eo-connectors-metrics-*")]
        spool_files = spool_bytes = 0
        for p in spool:
            f, b = dir_stats(p)
            spool_files, spool_bytes = spool_files + f, spool_bytes + b
        s["spool_files"], s["spool_kb"] = spool_files, round(spool_bytes / 1024, 1)
        chk = [dir_stats(lay.query(q) / "checkpoint") for q in QUERIES]
        s["checkpoint_files"] = sum(f for f, _ in chk)
        s["checkpoint_kb"] = round(sum(b for _, b in chk) / 1024, 1)
        s["source_wal_files"] = sum(files_in(lay.query(q) / "source-wal") for q in QUERIES)
        for q in ("rk", "txn"):
            wal = lay.query(q) / "sink-wal"
            s[f"{q}_wal_files"] = files_in(wal) - files_in(wal / "started")
        s["started_markers"] = sum(files_in(lay.query(q) / "sink-wal" / "started")
                                   for q in ("rk", "txn"))
        s["eo_log_files"] = files_in(lay.files / "_eo_log")
        s["staging_files"] = files_in(lay.files / "_eo_staging")
        meta_files, meta_bytes = dir_stats(lay.files / "_spark_metadata")
        s["spark_metadata_files"], s["spark_metadata_kb"] = meta_files, round(meta_bytes / 1024, 1)
        s["data_files"] = dir_stats(lay.files, skip=("_eo_log", "_eo_staging",
                                                     "_spark_metadata"))[0]

    def _postgres(self, s: dict[str, Any]) -> None:
        import psycopg

        stage = _stage_name(self.layout.sink_id("jdbc"))
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            s["pg_connections"] = conn.execute(
                "select count(*) from pg_stat_activity where application_name = %s",
                (app_name(self.layout),)).fetchone()[0]
            row = conn.execute("select count(*) from eo_sink_commits where sink_id = %s",
                               (self.layout.sink_id("jdbc"),)).fetchone()
            s["pg_commit_rows"] = row[0]
            for key, table in (("commits", "eo_sink_commits"), ("stage", stage),
                               ("target", self.layout.table)):
                got = conn.execute(
                    "select pg_total_relation_size(relid), n_dead_tup "
                    "from pg_stat_user_tables where relname = %s", (table,)).fetchone()
                if got is None:
                    continue
                if key != "commits":
                    s[f"pg_{key}_kb"] = round(got[0] / 1024, 1)
                s[f"pg_{key}_dead"] = got[1]

    def _kafka(self, s: dict[str, Any]) -> None:
        from confluent_kafka.admin import AdminClient

        if self.admin is None:
            self.admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        listed = self.admin.list_consumer_groups(request_timeout=20).result(30)
        groups = [g.group_id for g in listed.valid]
        tag = self.layout.run_id
        s["kafka_groups"] = sum(1 for g in groups if tag in g)
        s["fact_groups"] = sum(1 for g in groups if g.startswith("eo-sink-") and tag in g)
        if self.count % self.txn_every == 0 or self.last_txn is None:
            self.last_txn = self.broker.transactions()
        if self.last_txn is not None:
            s["txn_ids"] = sum(1 for line in self.last_txn if tag in line)

    def _metric_series(self) -> int | None:
        path = self.layout.work / "metrics-url"
        if not path.exists():
            return None
        try:
            with urllib.request.urlopen(path.read_text().strip(), timeout=10) as r:  # noqa: S310
                text = r.read().decode()
        except Exception:  # noqa: BLE001 - the driver may be restarting
            return None
        return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _stage_name(sink_id: str) -> str:
    from connectors.jdbc import options

    return options.staging_name(sink_id)


def _pg_port(dsn: str) -> int:
    return urlsplit(dsn).port or 5432


def app_name(layout: Layout) -> str:
    return f"eo-endurance-{layout.run_id}"


# -- growth -----------------------------------------------------------------------------------
def stretches(samples: list[dict[str, Any]], restarts: list[int], warmup: int,
              settle: int) -> list[list[dict[str, Any]]]:
    """The samples after warm-up, cut at each restart (``restarts``: the batch count at
    which each happened), each stretch without its first ``settle`` batches."""
    cuts = sorted(restarts)
    out: list[list[dict[str, Any]]] = []
    bounds = [0, *cuts, math.inf]
    for i in range(len(bounds) - 1):
        lo = bounds[i] + (warmup if i == 0 else settle)
        hi = bounds[i + 1]
        part = [s for s in samples if lo <= s["x"] < hi]
        if part:
            out.append(part)
    return out


def growth(parts: list[list[dict[str, Any]]], key: str) -> float | None:
    """Growth of ``key`` per 1,000 batches: the common slope of least-squares lines through
    each stretch (each with its own level), times 1,000; None with fewer than 3 points."""
    sxy = sxx = 0.0
    n = 0
    for part in parts:
        pts = [(s["x"], s[key]) for s in part if s.get(key) is not None]
        if len(pts) < 2:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts)
        sxx += sum((x - mx) ** 2 for x, _ in pts)
        n += len(pts)
    if n < 3 or sxx == 0:
        return None
    return sxy / sxx * 1000


def verdict(series: Series, g: float | None, samples: list[dict[str, Any]]) -> str:
    """flat, GROWS (past its tolerance), within its bound, PAST ITS BOUND, grows with the
    output, or ``-`` (a sum of series judged one by one). Shrinking is never a leak."""
    if series.cap is not None:
        peak, cap = _peak(samples, series.key), series.cap(samples)
        return (f"within its bound (peak {peak:,.0f} <= {cap:,.0f})" if peak <= cap
                else f"PAST ITS BOUND (peak {peak:,.0f} > {cap:,.0f})")
    if g is None:
        return "not measured"
    if series.tolerance is None:
        return "grows with the output" if series.output else "-"
    return "flat" if g <= series.tolerance else "GROWS"


def first_last(parts: list[list[dict[str, Any]]], key: str) -> tuple[Any, Any]:
    vals = [s[key] for part in parts for s in part if s.get(key) is not None]
    return (vals[0], vals[-1]) if vals else (None, None)


def table_md(rows: list[tuple[Series, float | None, Any, Any]], png: str | None,
             note: str, samples: list[dict[str, Any]]) -> str:
    lines = [note, "",
             "| series | after warm-up | at the end | growth per 1,000 batches | tolerance "
             "| verdict | bound |", "|---|---|---|---|---|---|---|"]
    for s, g, a, b in rows:
        tol = "-" if s.tolerance is None else f"{s.tolerance:g}"
        lines.append(f"| {s.label} | {_fmt(a)} | {_fmt(b)} | {_fmt(g, 2)} | {tol} "
                     f"| {verdict(s, g, samples)} | {s.bound} |")
    if png:
        lines += ["", f"![endurance]({png})"]
    return "\n".join(lines)


def _fmt(v: Any, digits: int = 1) -> str:
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"
    return "-"


def draw(samples: list[dict[str, Any]], restarts: list[tuple[int, str]], warmup: int,
         path: str, title: str) -> None:
    """Every series against batches, one panel per group; restarts as vertical lines,
    warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[Series]] = {}
    for s in SERIES:
        groups.setdefault(s.group, []).append(s)
    cols = 4
    panels = len(groups) + 1
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False)
    def frame(ax: Any, title: str) -> None:
        ax.axvspan(0, warmup, color="0.9")
        for at, what in restarts:
            ax.axvline(at, color="red" if "driver" in what else "purple", ls="--", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)

    for ax, (group, members) in zip(axes.flat, groups.items(), strict=False):
        for s in members:
            pts = [(x["x"], x[s.key]) for x in samples if x.get(s.key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s.label, lw=1.2)
        frame(ax, group)
        ax.legend(fontsize=6, loc="upper left")
    each = list(axes.flat)[len(groups)]
    by_pid: dict[str, list[tuple[int, float]]] = {}
    for x in samples:
        for pid, (rss, _, _) in (x.get("each_worker") or {}).items():
            by_pid.setdefault(str(pid), []).append((x["x"], rss))
    for pts in by_pid.values():
        each.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.6, color="0.4")
    frame(each, "RSS of each Python worker (MB)")
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.suptitle(title + "  (x: micro-batches per query; grey: warm-up; dashed: red "
                 "driver restart, purple broker restart)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- exactness --------------------------------------------------------------------------------
def exact(bootstrap: str, layout: Layout, dsn: str, sent: int) -> dict[str, dict[str, int]]:
    """Each sink against the records produced: {sink: {duplicates, missing, got}}."""
    from tests.helpers import jdbc_counts, scan_topic

    truth = Counter(f"v-{i:09d}" for i in range(sent))
    out: dict[str, dict[str, int]] = {}

    def compare(name: str, got: Counter[str]) -> None:
        out[name] = {"got": sum(got.values()),
                     "duplicates": sum(n - 1 for v, n in got.items() if n > 1 and v in truth)
                     + sum(n for v, n in got.items() if v not in truth),
                     "missing": sum(1 for v in truth if v not in got)}

    for name, topic in (("rk", layout.rk), ("txn", layout.txn)):
        messages, _ = scan_topic(bootstrap, topic, isolation="read_committed", timeout=300)
        compare(name, Counter(m.value().decode() for m in messages))
    counts = jdbc_counts(dsn, layout.table)
    want = Counter(f"k{i % KEYS}" for i in range(sent))
    out["jdbc"] = {"got": sum(counts.values()),
                   "duplicates": sum(max(0, counts.get(k, 0) - n) for k, n in want.items())
                   + sum(n for k, n in counts.items() if k not in want),
                   "missing": sum(max(0, n - counts.get(k, 0)) for k, n in want.items())}
    import pyarrow.dataset as ds

    from connectors.files.sink import committed_files

    paths = [p.removeprefix("file://") for p in committed_files(str(layout.files))]
    values = ds.dataset(paths, format="parquet").to_table(columns=["value"]) \
        .column("value").to_pylist() if paths else []
    compare("files", Counter(values))
    return out


# -- the run ----------------------------------------------------------------------------------
def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT,  # noqa: S607
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],  # noqa: S607
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + ("+dirty" if dirty.strip() else "")


def create_topics(bootstrap: str, layout: Layout) -> None:
    from connectors.demo.services.kafka import create_topic

    create_topic(bootstrap, layout.source, PARTITIONS)
    create_topic(bootstrap, layout.rk, PARTITIONS)
    create_topic(bootstrap, layout.txn, PARTITIONS)


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} endurance: {msg}", flush=True)


def wait_until(cond: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000,
                   help="micro-batches per query to reach (the run ends earlier at --minutes)")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--per-batch", type=int, default=40, help="maxOffsetsPerTrigger")
    p.add_argument("--warmup", type=int, default=None,
                   help="batches left out at the start (default 300; --reanalyze: the run's)")
    p.add_argument("--settle", type=int, default=None,
                   help="batches left out after each restart (default 100; --reanalyze: the "
                   "run's)")
    p.add_argument("--driver-restart-at", type=float, default=None,
                   help="minutes into the run (default: 40%% of --minutes)")
    p.add_argument("--broker-restart-at", type=float, default=None,
                   help="minutes into the run (default: 70%% of --minutes)")
    p.add_argument("--no-restarts", action="store_true")
    p.add_argument("--bootstrap", default=None,
                   help="an existing broker (no broker restart, no transactional ids)")
    p.add_argument("--dsn", default=os.environ.get("POSTGRES_DSN", DEFAULT_DSN))
    p.add_argument("--workdir", default=None, help="default: a new temp dir, removed after")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory and the JDBC sink's tables and commit row")
    p.add_argument("--png", default=os.path.join(HERE, "results", "endurance.png"))
    p.add_argument("--samples", default=None, help="write every sample here (JSON lines)")
    p.add_argument("--txn-every", type=int, default=1,
                   help="ask Kafka for transactional ids every N samples (a JVM each)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the app")
    p.add_argument("--java-options", default="", help="more options of the driver JVM")
    p.add_argument("--reanalyze", metavar="LOG", default=None,
                   help="make the table, chart and RESULT again from a finished run's log and "
                   "its --samples file, without running")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a flat series grew, a WAL kept too much, an output was "
                   "not exact or a query terminated (the CI test)")
    return p


class Run:
    """One endurance run: the broker, the app, the producer and the sampler, the schedule of
    restarts, and what the run found."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.own_work = args.workdir is None
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="eo-endurance-",
                                                          dir=broker_data_root()))
        self.work.mkdir(parents=True, exist_ok=True)
        run_id = uuid.uuid4().hex[:8]
        self.layout = Layout(self.work, run_id, f"endurance-src-{run_id}",
                             f"endurance-rk-{run_id}", f"endurance-txn-{run_id}",
                             f"endurance_{run_id}")
        self.commit = git_commit()
        say(f"run {run_id} on commit {self.commit}; work {self.work}")
        self.broker = Broker(args.bootstrap, self.work).start()
        create_topics(self.broker.bootstrap, self.layout)
        self.app = App(self.app_argv(), self.app_env(), self.work / "app.log")
        self.load = Load(self.broker.bootstrap, self.layout, args.per_batch)
        self.sampler = Sampler(self.layout, self.broker, args.dsn, self.app,
                               max(1, args.txn_every))
        self.samples: list[dict[str, Any]] = []
        self.restarts: list[tuple[int, str]] = []
        self.unexpected: list[str] = []
        self.plan: list[tuple[float, str]] = []
        if not args.no_restarts:
            self.plan.append(((args.driver_restart_at if args.driver_restart_at is not None
                               else 0.4 * args.minutes) * 60, "driver"))
            if not self.broker.external:
                self.plan.append(((args.broker_restart_at if args.broker_restart_at is not None
                                   else 0.7 * args.minutes) * 60, "broker"))
            self.plan.sort()
        self.minutes = 0.0

    def app_argv(self) -> list[str]:
        a, lay = self.args, self.layout
        query = urlsplit(a.dsn).query
        jdbc_url = ("postgresql+psycopg://" + a.dsn.split("://", 1)[1]
                    + ("&" if query else "?") + f"application_name={app_name(lay)}")
        return [sys.executable, APP, "--bootstrap", self.broker.bootstrap,
                "--source-topic", lay.source, "--rk-topic", lay.rk, "--txn-topic", lay.txn,
                "--jdbc-url", jdbc_url, "--table", lay.table, "--files", str(lay.files),
                "--work", str(lay.app_work), "--tmp", str(lay.tmp),
                "--stop", str(self.work / "stop"),
                "--metrics-file", str(self.work / "metrics-url"), "--run-id", lay.run_id,
                "--per-batch", str(a.per_batch), "--java-options", a.java_options,
                *(x for c in a.conf for x in ("--conf", c))]

    @staticmethod
    def app_env() -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        env.pop("CONNECTORS_FAILPOINTS", None)
        return env

    def least_batches(self) -> int:
        return min(self.sampler.batches().values())

    def drive(self, out: Any) -> None:
        """Sample every ``--interval`` s, restart what the schedule says when it says, start
        the app again if it ended; until ``--rows`` batches per query or ``--minutes``."""
        self.load.thread.start()
        self.app.start()
        began = time.monotonic()
        next_sample = began
        while True:
            now = time.monotonic()
            if now >= next_sample:
                s = self.sampler.sample()
                s["minute"] = round((now - began) / 60, 2)
                self.samples.append(s)
                if out:
                    out.write(json.dumps(s) + "\n")
                    out.flush()
                say(f"{s['minute']:.1f} min, batches {s['batches']}, driver fds "
                    f"{s.get('driver_fds')}, JVM fds {s.get('jvm_fds')} threads "
                    f"{s.get('jvm_threads')}, workers {s.get('workers')}, tmp files "
                    f"{s.get('tmp_files')}")
                next_sample += self.args.interval
            if not self.app.alive():
                code = self.app.proc.returncode if self.app.proc else "?"
                self.unexpected.append(f"the app ended ({code}) at {self.least_batches()} "
                                       "batches")
                say(self.unexpected[-1] + "; starting it again")
                self.restarts.append((self.least_batches(), "driver (after a termination)"))
                self.app.start()
            if self.plan and now - began >= self.plan[0][0]:
                self.restart(self.plan.pop(0)[1])
            if self.least_batches() >= self.args.rows or now - began >= self.args.minutes * 60:
                break
            time.sleep(min(1.0, max(0.05, next_sample - time.monotonic())))
        self.minutes = (time.monotonic() - began) / 60

    def restart(self, what: str) -> None:
        at = self.least_batches()
        if what == "driver":
            say(f"SIGKILL of the driver's process group at {at} batches")
            self.app.kill()
            self.app.start()
        else:
            say(f"restarting the broker at {at} batches")
            self.load.pause()
            self.broker.restart()
            self.load.resume()
        self.restarts.append((at, what))

    def finish(self) -> tuple[int, int, dict[str, dict[str, int]]]:
        """Stop the producer, let every query read what it wrote, stop the app; then
        (terminations, aborts) from its log and each sink checked against the records."""
        say(f"stopping the producer after {self.minutes:.1f} min; {self.load.sent} records sent")
        self.load.stop.set()
        self.load.thread.join(180)
        drained = wait_until(lambda: all(
            committed_end(self.layout.query(q) / "checkpoint", self.layout.source)
            >= self.load.sent for q in QUERIES) or not self.app.alive(), 600)
        (self.work / "stop").touch()
        if self.app.proc is not None:
            try:
                self.app.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.app.kill()
        text = self.app.text()
        terminations = sum(text.count(t) for t in TERMINATIONS)
        aborts = sum(text.count(a) for a in ABORTS)
        say(f"drained: {drained}; terminations {terminations}, aborts {aborts}; checking "
            "the outputs")
        checks = exact(self.broker.bootstrap, self.layout, self.args.dsn, self.load.sent)
        for name, c in checks.items():
            say(f"  {name}: {c}")
        return terminations, aborts, checks

    def report(self, terminations: int, aborts: int,
               checks: dict[str, dict[str, int]]) -> list[str]:
        """Print the table and the RESULT line, draw the chart; what ``--check`` fails on."""
        facts = Facts(minutes=self.minutes, records=self.load.sent,
                      terminations=terminations + len(self.unexpected), aborts=aborts,
                      exact=all(c["duplicates"] == 0 and c["missing"] == 0
                                for c in checks.values()),
                      unexpected=self.unexpected, commit=self.commit,
                      run_id=self.layout.run_id, restarts=self.restarts)
        return analyze(self.samples, facts, self.args)

    def close(self) -> None:
        self.load.stop.set()
        self.app.kill()
        self.broker.stop()
        if not self.args.keep:
            if self.own_work:
                shutil.rmtree(self.work, ignore_errors=True)
            _drop_tables(self.args.dsn, self.layout)


@dataclass
class Facts:
    """What a run found besides its samples."""

    minutes: float
    records: int
    terminations: int  # query terminations, the app's unexpected ends among them
    aborts: int
    exact: bool
    unexpected: list[str]
    commit: str
    run_id: str
    restarts: list[tuple[int, str]]
    reanalyzed: str | None = None  # the log this analysis was made again from


def analyze(samples: list[dict[str, Any]], facts: Facts, a: argparse.Namespace) -> list[str]:
    """Growth of every series after warm-up, the table, the chart and the RESULT line
    (printed); returns what ``--check`` fails on."""
    parts = stretches(samples, [at for at, _ in facts.restarts], a.warmup, a.settle)
    rows = [(series, growth(parts, series.key), *first_last(parts, series.key))
            for series in SERIES]
    batches = min(samples[-1]["batches"].values()) if samples else 0
    restarts = ", ".join(f"{w} restart at {at:,} batches" for at, w in facts.restarts)
    note = (f"{batches:,} micro-batches per query (at least) in {facts.minutes:.0f} min, "
            f"4 queries at processingTime 0, <= {a.per_batch} records per batch, "
            f"{facts.records:,} records; {restarts or 'no restarts'}; warm-up "
            f"{a.warmup} batches, {a.settle} after each restart; commit {facts.commit}; "
            f"samples every {a.interval:g} s."
            + (f" (Table made again from the run's samples and log, {facts.reanalyzed}.)"
               if facts.reanalyzed else ""))
    link = None
    if a.png and samples:
        os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
        day = time.strftime("%Y-%m-%d", time.localtime(samples[0]["t"]))
        draw(samples, facts.restarts, a.warmup, a.png, f"endurance {day}, commit {facts.commit}")
        link = png_link(a.png)
    md = table_md(rows, link, note, samples)
    print(md, flush=True)
    measured = sum(part[-1]["x"] - part[0]["x"] for part in parts)
    failures = check_failures(rows, measured, samples, facts.terminations, facts.aborts,
                              facts.exact, facts.unexpected)
    for f in failures:
        print(f"CHECK FAILED: {f}", flush=True)
    result = {
        "bench": "endurance", "rows": a.rows, "minutes": round(facts.minutes, 1),
        "batches_per_query": batches, "records": facts.records,
        "driver_restarts": sum(1 for _, w in facts.restarts if w.startswith("driver")),
        "broker_restarts": sum(1 for _, w in facts.restarts if w == "broker"),
        "restarts_at": [[at, w] for at, w in facts.restarts],
        "warmup": a.warmup, "settle": a.settle,
        "query_terminations": facts.terminations, "aborts": facts.aborts,
        "exact": facts.exact,
        "series_growing": [s.key for s, g, _, _ in rows
                           if verdict(s, g, samples).startswith(("GROWS", "PAST"))],
        "commit": facts.commit, "run_id": facts.run_id, "table_md": md,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return failures


def reanalyze(log_path: str, a: argparse.Namespace) -> list[str]:
    """The analysis of a finished run made again from its samples (``--samples``) and its
    log (its RESULT line and restart lines): another warm-up, or a corrected verdict,
    without running the hour again. The facts the run found stay the log's."""
    text = Path(log_path).read_text(errors="replace")
    old = json.loads(next(line for line in reversed(text.splitlines())
                          if line.startswith("RESULT "))[len("RESULT "):])
    restarts = [(int(at), w) for at, w in old.get("restarts_at", [])] or [
        (int(m.group(2).replace(",", "")), "driver" if m.group(1) == "SIGKILL" else "broker")
        for m in re.finditer(r"endurance: (SIGKILL|restarting) .*? at ([\d,]+) batches",
                             text)]
    facts = Facts(minutes=old["minutes"], records=old["records"],
                  terminations=old["query_terminations"], aborts=old["aborts"],
                  exact=old["exact"], unexpected=[], commit=old["commit"],
                  run_id=old.get("run_id") or next(iter(re.findall(r"endurance: run (\w+) on",
                                                                   text)), "?"),
                  restarts=restarts,
                  reanalyzed=f"{os.path.basename(log_path)}, by commit {git_commit()}")
    a.warmup = old.get("warmup", WARMUP) if a.warmup is None else a.warmup
    a.settle = old.get("settle", SETTLE) if a.settle is None else a.settle
    samples = [json.loads(line) for line in Path(a.samples).read_text().splitlines() if line]
    return analyze(samples, facts, a)


def png_link(png: str) -> str:
    """The chart's path as BENCHMARKS.md (at the repository's root) links it: a chart in a
    ``bench/results`` directory is the repository's, wherever the run's checkout was."""
    path = Path(png).resolve()
    if path.parent.name == "results" and path.parent.parent.name == "bench":
        return f"bench/results/{path.name}"
    return os.path.relpath(path, ROOT)


#: The warm-up and settling defaults (``--warmup``, ``--settle``), in batches.
WARMUP, SETTLE = 300, 100


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.reanalyze:
        if not args.samples:
            raise SystemExit("--reanalyze LOG needs --samples FILE (the run's samples)")
        return 1 if reanalyze(args.reanalyze, args) and args.check else 0
    args.warmup = WARMUP if args.warmup is None else args.warmup
    args.settle = SETTLE if args.settle is None else args.settle
    run = Run(args)
    out = open(args.samples, "w") if args.samples else None  # noqa: SIM115
    try:
        run.drive(out)
        failures = run.report(*run.finish())
    finally:
        if out:
            out.close()
        run.close()
    return 1 if args.check and failures else 0


def check_failures(rows: list[tuple[Series, float | None, Any, Any]], measured: int,
                   samples: list[dict[str, Any]], terminations: int, aborts: int,
                   all_exact: bool, unexpected: list[str]) -> list[str]:
    """What ``--check`` fails on: a series that grew more than its ``ci`` allows over the
    ``measured`` batches after warm-up, a WAL past its retention at any sample, an output
    not exact, a query terminated or a process aborted."""
    out = []
    for s, g, a, b in rows:
        if s.ci is None:
            continue
        if g is None:
            out.append(f"{s.label}: too few samples after warm-up to measure its growth")
        elif g * measured / 1000 > s.ci:
            out.append(f"{s.label} grew {g * measured / 1000:.1f} over the {measured} batches "
                       f"measured after warm-up ({g:.1f} per 1,000 batches; from {a} to {b}; "
                       f"at most {s.ci:g} allowed)")
    for key, most in retention_limits().items():
        over = [x for x in samples if (x.get(key) or 0) > most]
        if over:
            out.append(f"{BY_KEY[key].label}: {over[-1][key]} files at {over[-1]['x']} batches, "
                       f"more than the retention allows ({most})")
    if not all_exact:
        out.append("an output is not exact")
    if terminations or unexpected:
        out.append(f"{terminations} query terminations in the app's log; {unexpected}")
    if aborts:
        out.append(f"{aborts} signs of a process abort in the app's log")
    return out


def retention_limits() -> dict[str, int]:
    """The most files each WAL may hold at any time, from the retention rules' constants
    (each kept window/commit is a record and a marker; retention runs every RETAIN_EVERY-th
    batch; an in-flight batch adds its own)."""
    from connectors.core.wal import RETAIN_EVERY
    from connectors.files.sink import LOG_RETENTION
    from connectors.files.spark_metadata import COMPACT_INTERVAL, MIN_BATCHES_TO_RETAIN
    from connectors.kafka.sink.recovery import KEEP_COMMITS
    from connectors.kafka.source.planner import WAL_KEEP_WINDOWS

    slack = RETAIN_EVERY + 2
    return {
        # Spark's offsets/ and commits/, each entry with its .crc, per query; metadata
        "checkpoint_files": len(QUERIES) * (2 * 2 * (SPARK_MIN_BATCHES_TO_RETAIN + 10) + 4),
        "source_wal_files": len(QUERIES) * 2 * (WAL_KEEP_WINDOWS + slack),
        "rk_wal_files": KEEP_COMMITS + slack + 2,  # commits, the owner record
        "txn_wal_files": KEEP_COMMITS + slack + 2,
        "eo_log_files": 2 * (LOG_RETENTION + slack),  # a plan and a commit per batch
        "started_markers": 2 * PARTITIONS * (RETAIN_EVERY + 2),
        "staging_files": 2 * PARTITIONS * (RETAIN_EVERY + 2),
        "spark_metadata_files": MIN_BATCHES_TO_RETAIN + 2 * COMPACT_INTERVAL + 2,
    }


def _drop_tables(dsn: str, layout: Layout) -> None:
    with contextlib.suppress(Exception):
        import psycopg
        from psycopg import sql

        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            for t in (layout.table, _stage_name(layout.sink_id("jdbc")),
                      _stage_name(layout.sink_id("jdbc")) + "_blocks"):
                conn.execute(sql.SQL("drop table if exists {}").format(sql.Identifier(t)))
            conn.execute("delete from eo_sink_commits where sink_id = %s",
                         (layout.sink_id("jdbc"),))


if __name__ == "__main__":
    sys.exit(main())
