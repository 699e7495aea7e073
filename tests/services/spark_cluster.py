"""A Spark standalone cluster and a Spark Connect server, from the installed pyspark only.

``StandaloneCluster``: ``bin/spark-class org.apache.spark.deploy.master.Master`` and N
``...deploy.worker.Worker`` processes (one core each by default) on loopback, on free
ports, with their logs and work directories in ``workdir``. Every executor of an
application is then a JVM of its own, launched by a worker, with its own Python workers,
so the driver and the executors share no process and no memory: what local mode hides.

``ConnectServer``: ``spark-submit --class org.apache.spark.sql.connect.service.
SparkConnectServer`` (the jar ships in pyspark's ``jars/``) on a free port, with ``local[2]``
or a cluster master; clients use ``SparkSession.builder.remote(server.url)``.

Both pass ``PYTHONPATH`` (this checkout) and ``PYSPARK_PYTHON`` (this interpreter) to every
JVM they start: what ``pip install`` on every node, or a packed environment, gives a real
cluster (docs/deploying.md).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.demo.services.kafka import free_port
from tests.helpers import jvm_options, prepare_spark_jvms, wait_for

log = logging.getLogger(__name__)

REPO = str(Path(__file__).resolve().parents[2])
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CONNECT_MAIN = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def service_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every JVM we start: loopback, this interpreter, this checkout."""
    env = dict(os.environ)
    env.pop("CONNECTORS_FAILPOINTS", None)
    path = env.get("PYTHONPATH", "")
    env.update({
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": REPO + (os.pathsep + path if path else ""),
        # C1 only and a small heap: the daemons mostly wait on sockets.
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    })
    env.update(extra or {})
    return env


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.extend(int(p) for p in task.read_text().split())
        except OSError:
            continue
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(condition: Any, timeout: float, what: str, logs: str) -> Any:
    return wait_for(condition, timeout, 0.3, what=f"{what} (logs: {logs})")


@dataclass
class WorkerProc:
    index: int
    port: int
    ui_port: int
    log_path: str
    work_dir: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"worker {self.index} is not running")
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class StandaloneCluster:
    """One master and ``workers`` workers with ``cores`` cores each, on 127.0.0.1."""

    workdir: str
    workers: int = 2
    cores: int = 1
    worker_memory: str = "1g"
    # A dead worker is noticed after this many seconds without a heartbeat (Spark: 60).
    worker_timeout: int = 6
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    nodes: list[WorkerProc] = field(default_factory=list)
    master: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def master_log(self) -> str:
        return os.path.join(self.workdir, "master.log")

    def logs(self) -> str:
        return ", ".join([self.master_log, *(w.log_path for w in self.nodes)])

    def _spark_class(self, main: str, *args: str, log_path: str,
                     extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), main, *args]
        with open(log_path, "ab") as out:
            # A session of its own: SIGKILL of the group takes the JVM and its children
            # (a worker's executors) down together, like a lost machine.
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,  # noqa: S603
                                    env=service_env(extra_env), cwd=self.workdir,
                                    start_new_session=True)

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        began = time.monotonic()
        os.makedirs(self.workdir, exist_ok=True)
        self.master = self._spark_class(
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.master_port), "--webui-port", str(self.master_ui_port),
            log_path=self.master_log,
            extra_env={"SPARK_MASTER_OPTS": f"-Dspark.worker.timeout={self.worker_timeout}"},
        )
        try:
            _wait(lambda: self._state() is not None, timeout, "the Spark master", self.logs())
            for i in range(self.workers):
                self.nodes.append(self._new_worker(i))
            self.wait_workers(self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _new_worker(self, index: int) -> WorkerProc:
        w = WorkerProc(index, free_port(), free_port(),
                       os.path.join(self.workdir, f"worker-{index}.log"),
                       os.path.join(self.workdir, f"worker-{index}-work"))
        os.makedirs(w.work_dir, exist_ok=True)
        w.proc = self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(w.port), "--webui-port", str(w.ui_port),
            "--cores", str(self.cores), "--memory", self.worker_memory,
            "--work-dir", w.work_dir, self.url, log_path=w.log_path,
            # The worker heartbeats every timeout/4 of *its own* setting: without this it
            # keeps Spark's 60 s (a beat every 15 s) and the master drops it every 6 s.
            extra_env={"SPARK_WORKER_OPTS": f"-Dspark.worker.timeout={self.worker_timeout}"})
        return w

    def _state(self) -> dict[str, Any] | None:
        try:
            url = f"http://127.0.0.1:{self.master_ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                state: dict[str, Any] = json.load(r)
                return state
        except (OSError, ValueError):
            if self.master is not None and self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited; log {self.master_log}") from None
            return None

    def alive_workers(self) -> int:
        state = self._state() or {}
        return int(state.get("aliveworkers", 0))

    def wait_workers(self, n: int, timeout: float = 90.0) -> None:
        _wait(lambda: self.alive_workers() == n, timeout, f"{n} alive workers", self.logs())

    def executors(self, worker: WorkerProc) -> list[int]:
        """The executor JVMs this worker launched (its child processes), found through it."""
        if not worker.running():
            return []
        return [p for p in _children(worker.pid) if EXECUTOR_MAIN in cmdline(p)]

    def executor_of(self, pid: int) -> tuple[WorkerProc, int] | None:
        """The worker and executor JVM whose process tree holds ``pid`` (a Python worker)."""
        for w in self.nodes:
            for ex in self.executors(w):
                p: int | None = pid
                while p and p > 1:
                    if p == ex:
                        return w, ex
                    p = parent(p)
        return None

    def kill_worker(self, worker: WorkerProc) -> None:
        """SIGKILL the worker JVM and its executors at once (its process group)."""
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if worker.proc is not None:
            worker.proc.wait(timeout=30)

    def restart_worker(self, worker: WorkerProc, timeout: float = 90.0) -> WorkerProc:
        """A new worker in place of a dead one (new ports), once the master dropped it."""
        self.wait_workers(self.workers - 1, timeout)
        fresh = self._new_worker(worker.index)
        self.nodes[self.nodes.index(worker)] = fresh
        self.wait_workers(self.workers, timeout)
        return fresh

    def healthy(self) -> bool:
        return (self.master is not None and self.master.poll() is None
                and all(w.running() for w in self.nodes)
                and self.alive_workers() == self.workers)

    def executor_dirs(self, app_id: str) -> dict[int, list[str]]:
        """worker index -> executor ids that ran ``app_id`` there (the workers' work dirs)."""
        out: dict[int, list[str]] = {}
        for w in self.nodes:
            d = Path(w.work_dir) / app_id
            if d.is_dir():
                out[w.index] = sorted(p.name for p in d.iterdir() if p.is_dir())
        return out

    def stop(self) -> None:
        for proc in [*(w.proc for w in self.nodes), self.master]:
            if proc is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)


def cluster_conf(cluster: StandaloneCluster) -> dict[str, str]:
    """What an application on ``cluster`` sets: one 1-core executor per worker, the
    checkout on the executors' PYTHONPATH, no speculation (the Kafka sink's rule)."""
    prepare_spark_jvms()
    env = service_env()
    return {
        "spark.master": cluster.url,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": str(cluster.workers * cluster.cores),
        "spark.executorEnv.PYTHONPATH": env["PYTHONPATH"],
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.speculation": "false",
        "spark.task.maxFailures": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.driver.extraJavaOptions": jvm_options(),
        "spark.executor.extraJavaOptions": jvm_options(),
    }


@dataclass
class ConnectServer:
    """A Spark Connect server (``SparkConnectServer`` through ``spark-submit``)."""

    workdir: str
    master: str = "local[2]"
    conf: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "connect-server.log")

    def start(self, timeout: float = 180.0) -> ConnectServer:
        began = time.monotonic()
        os.makedirs(self.workdir, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "1g",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.streaming.stopTimeout": "30s",
            **self.conf,
        }
        cmd = [os.path.join(spark_home(), "bin", "spark-submit"), "--master", self.master,
               "--class", CONNECT_MAIN, "--name", "eo-connect-server"]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,  # noqa: S603
                                         # spark-submit sizes SparkConnectServer's JVM
                                         # as a daemon's
                                         env=service_env({"SPARK_DAEMON_MEMORY": "1g"}),
                                         cwd=self.workdir,
                                         start_new_session=True)
        try:
            _wait(self._ready, timeout, "the Spark Connect server", self.log_path)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited; log {self.log_path}")
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
