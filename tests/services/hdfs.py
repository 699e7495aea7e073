"""A real, single-node HDFS for the test tier: a NameNode and a DataNode with WebHDFS on.

:class:`LocalHdfs` runs the Apache Hadoop daemons themselves (no mock, no MiniDFSCluster),
from the jars of the ``hdfs`` profile of ``connectors/demo/services/pom.xml``, resolved once
from Maven Central:

1. ``NameNode -format -force -nonInteractive`` formats a name directory in a temp dir;
2. the NameNode and the DataNode start as two JVMs *at the same time* (the DataNode retries
   the NameNode's RPC port every 100 ms until it answers), on free loopback ports: NameNode
   RPC and HTTP, DataNode data transfer, HTTP and IPC;
3. readiness: the NameNode's JMX shows it out of safe mode with one live DataNode, then a
   small file goes through WebHDFS and back (the two-step CREATE: the NameNode answers 307
   with a ``Location`` on the DataNode's HTTP port, the client PUTs the bytes there).

:meth:`LocalHdfs.stop_daemon` and :meth:`LocalHdfs.start_daemon` stop one daemon and start it
again on the same ports and data directories (the storage faults of ``tests/nemesis.py``);
a NameNode can come back in safe mode for a while, as a production one does.

Single node: replication 1, permissions off (any WebHDFS user may write anywhere), safe mode
left as soon as the NameNode starts (no block threshold, no extension). The DataNode
registers as ``127.0.0.1``, so WebHDFS redirects point at loopback. Logs and every file of
both daemons live in ``workdir`` (``namenode.log``, ``datanode.log``, ``*.out`` for the JVMs'
own output), and a start-up failure names them.

The Maven Central ``hadoop-hdfs`` jar does not carry the ``webapps/`` resources that Hadoop's
HTTP server requires to exist on the classpath (the binary tarball ships them beside the
jars). WebHDFS itself is registered in code, not by a web.xml, so an empty
``webapps/{hdfs,datanode}`` tree in the workdir satisfies the check; the NameNode's HTML UI
is absent and nothing here needs it.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven
from connectors.demo.services.kafka import _stop, free_port

log = logging.getLogger(__name__)

# Only what a one-node test cluster needs to differ from hdfs-default.xml, and why.
_SITE = {
    "core-site.xml": {
        "fs.defaultFS": "hdfs://127.0.0.1:{rpc_port}",
        "hadoop.tmp.dir": "{workdir}/tmp",
        # Clients (the DataNode's RPC to the NameNode) retry a closed port every 100 ms
        # instead of every second: both daemons start at once.
        "ipc.client.connect.retry.interval": "100",
        "ipc.client.connect.max.retries": "600",
        "hadoop.security.authentication": "simple",
        "hadoop.http.staticuser.user": "{user}",
    },
    "hdfs-site.xml": {
        "dfs.namenode.name.dir": "file://{workdir}/name",
        "dfs.datanode.data.dir": "file://{workdir}/data",
        "dfs.namenode.rpc-address": "127.0.0.1:{rpc_port}",
        "dfs.namenode.http-address": "127.0.0.1:{http_port}",
        "dfs.namenode.https-address": "127.0.0.1:0",
        "dfs.namenode.secondary.http-address": "127.0.0.1:0",
        "dfs.datanode.address": "127.0.0.1:{dn_port}",
        "dfs.datanode.http.address": "127.0.0.1:{dn_http_port}",
        "dfs.datanode.ipc.address": "127.0.0.1:{dn_ipc_port}",
        "dfs.datanode.https.address": "127.0.0.1:0",
        # WebHDFS redirects name the DataNode by the host it registered with.
        "dfs.datanode.hostname": "127.0.0.1",
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
        "dfs.webhdfs.enabled": "true",
        "dfs.replication": "1",
        "dfs.namenode.replication.min": "1",
        "dfs.permissions.enabled": "false",
        # Leave safe mode at once: an empty namespace has no blocks to wait for.
        "dfs.namenode.safemode.extension": "0",
        "dfs.namenode.safemode.threshold-pct": "0",
        "dfs.namenode.safemode.min.datanodes": "0",
        # Heartbeats and the first block report without delay, so the DataNode is usable
        # for writes (its storage reported) within a second of registering.
        "dfs.heartbeat.interval": "1",
        "dfs.blockreport.initialDelay": "0",
        # Fewer threads and no background scanning on 2 shared cores.
        "dfs.namenode.handler.count": "4",
        "dfs.namenode.service.handler.count": "2",
        "dfs.datanode.handler.count": "3",
        "dfs.block.scanner.volume.bytes.per.second": "0",
        "dfs.datanode.directoryscan.interval": "-1",
        # A temp dir on a busy disk must not push the NameNode into safe mode.
        "dfs.namenode.resource.du.reserved": "0",
        "dfs.namenode.resource.check.interval": "600000",
        "dfs.namenode.edits.noeditlogchannelflush": "true",
    },
}

_LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${hadoop.log.dir}/${hadoop.log.file}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
log4j.logger.org.apache.hadoop.metrics2=WARN
log4j.logger.BlockStateChange=WARN
log4j.logger.org.apache.hadoop.hdfs.StateChange=WARN
log4j.logger.org.apache.hadoop.hdfs.server.namenode.FSNamesystem.audit=WARN
log4j.logger.org.apache.hadoop.hdfs.server.datanode.DataNode.clienttrace=WARN
"""

# Hadoop 3.4 on Java 17 reflects into java.base (the launch scripts add the same opens).
_JAVA17_OPENS = ("java.base/java.lang", "java.base/java.nio", "java.base/sun.nio.ch",
                 "java.base/java.util", "java.base/java.util.concurrent",
                 "java.base/java.lang.reflect", "java.base/java.io", "java.base/java.net",
                 "java.base/sun.security.util")


_MAIN_CLASS = {
    "namenode": "org.apache.hadoop.hdfs.server.namenode.NameNode",
    "datanode": "org.apache.hadoop.hdfs.server.datanode.DataNode",
}


def _xml(properties: dict[str, str]) -> str:
    body = "".join(
        f"  <property><name>{k}</name><value>{v}</value></property>\n"
        for k, v in properties.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


class LocalHdfs:
    """A NameNode and a DataNode (Apache Hadoop ``hdfs`` profile jars) on free loopback ports.

    ``webhdfs_url`` (``http://127.0.0.1:<NameNode HTTP port>``) is what the WebHDFS backend
    talks to; ``hdfs_url`` (``hdfs://127.0.0.1:<RPC port>``) is the cluster's own name for
    itself. The daemons' files live in ``workdir`` (a temp directory by default, removed by
    :meth:`stop` unless ``keep=True``).
    """

    def __init__(self, *, workdir: str | None = None, heap: str = "256m",
                 keep: bool = False) -> None:
        self.rpc_port, self.http_port = free_port(), free_port()
        self.dn_port, self.dn_http_port, self.dn_ipc_port = free_port(), free_port(), free_port()
        self.webhdfs_url = f"http://127.0.0.1:{self.http_port}"
        self.hdfs_url = f"hdfs://127.0.0.1:{self.rpc_port}"
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="eo-hdfs-"))
        self.log_dir = str(self.workdir)
        self.heap = heap
        self.keep = keep
        self.version = "?"
        self.started_in: float | None = None  # seconds from format to ready
        self._classpath = ""
        self._user = ""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- layout ------------------------------------------------------------------------------
    def log_path(self, daemon: str) -> str:
        return str(self.workdir / f"{daemon}.log")

    def _logs(self) -> str:
        return ", ".join(str(self.workdir / n) for n in (
            "namenode.log", "namenode.out", "datanode.log", "datanode.out"))

    def _write_config(self, user: str, overrides: dict[str, str] | None = None) -> None:
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        values = {"workdir": self.workdir, "user": user, "rpc_port": self.rpc_port,
                  "http_port": self.http_port, "dn_port": self.dn_port,
                  "dn_http_port": self.dn_http_port, "dn_ipc_port": self.dn_ipc_port}
        for name, props in _SITE.items():
            settings = {k: v.format(**values) for k, v in props.items()}
            if name == "hdfs-site.xml":
                settings.update(overrides or {})
            (conf / name).write_text(_xml(settings))
        (conf / "log4j.properties").write_text(_LOG4J)
        for app in ("hdfs", "datanode"):
            (self.workdir / "resources" / "webapps" / app).mkdir(parents=True, exist_ok=True)

    def _java(self, daemon: str, main_class: str, *args: str) -> list[str]:
        return [
            "java", f"-Xmx{self.heap}", "-Xms32m", "-Xss512k", "-XX:+UseSerialGC",
            # C1 only: these JVMs live for one test session and mostly wait on sockets.
            "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", "-Xshare:auto",
            "-Djava.net.preferIPv4Stack=true", "-Djava.awt.headless=true",
            *(f"--add-opens={m}=ALL-UNNAMED" for m in _JAVA17_OPENS),
            f"-Dhadoop.log.dir={self.workdir}", f"-Dhadoop.log.file={daemon}.log",
            f"-Dhadoop.home.dir={self.workdir}",
            f"-Dlog4j.configuration=file:{self.workdir / 'conf' / 'log4j.properties'}",
            "-cp", self._classpath, main_class, *args,
        ]

    # -- life cycle --------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> LocalHdfs:
        began = time.monotonic()
        jars = maven.resolve("hdfs")
        self.version = maven.jar_version(jars, "hadoop-hdfs") or "?"
        self._classpath = ":".join([str(self.workdir / "conf"), str(self.workdir / "resources"),
                                    maven.classpath(jars)])
        self._user = getpass.getuser()
        self._write_config(self._user)
        fmt = subprocess.run(  # noqa: S603 - fixed argv
            self._java("format", "org.apache.hadoop.hdfs.server.namenode.NameNode",
                       "-format", "-force", "-nonInteractive"),
            capture_output=True, text=True, timeout=120, check=False,
        )
        if fmt.returncode != 0:
            raise ConnectorError(
                f"formatting the HDFS NameNode in {self.workdir / 'name'} failed "
                f"(exit {fmt.returncode}, log {self.log_path('format')}): "
                f"{(fmt.stdout + fmt.stderr)[-2000:]}"
            )
        try:
            for daemon in _MAIN_CLASS:
                self._spawn(daemon)
            self._wait_ready(began + timeout)
        except BaseException:
            self.keep = True  # the error names these logs
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        log.info("HDFS %s: NameNode %s (WebHDFS %s), DataNode 127.0.0.1:%d, up in %.1fs, "
                 "logs in %s", self.version, self.hdfs_url, self.webhdfs_url,
                 self.dn_port, self.started_in, self.log_dir)
        return self

    def _spawn(self, daemon: str) -> None:
        with open(self.workdir / f"{daemon}.out", "ab") as out:
            self._procs[daemon] = subprocess.Popen(  # noqa: S603 - fixed argv
                self._java(daemon, _MAIN_CLASS[daemon]), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    # -- faults (tests/nemesis.py): one daemon stopped and started again ----------------------
    def stop_daemon(self, daemon: str, *, kill: bool = False) -> None:
        """Stop the ``namenode`` or ``datanode``: SIGTERM (a clean shutdown), or SIGKILL."""
        proc = self._procs.pop(daemon, None)
        if proc is None:
            return
        if kill:
            proc.kill()
            proc.wait(30)
        else:
            _stop(proc, grace=10.0)

    def start_daemon(self, daemon: str, *, safe_mode_seconds: float = 0.0,
                     timeout: float = 120.0) -> None:
        """Start the daemon again on the same ports and data directories. Returns once
        HDFS takes writes again; a NameNode started with ``safe_mode_seconds`` stays in
        safe mode that long after its DataNode reported its blocks (``safemode.extension``,
        as a production NameNode does for 30 s after a restart), and this returns as soon
        as it answers (in safe mode), so that clients meet the safe mode."""
        overrides = {}
        if daemon == "namenode" and safe_mode_seconds > 0:
            overrides = {"dfs.namenode.safemode.threshold-pct": "0.999",
                         "dfs.namenode.safemode.min.datanodes": "1",
                         "dfs.namenode.safemode.extension": str(int(safe_mode_seconds * 1000))}
        self._write_config(self._user, overrides)
        self._spawn(daemon)
        deadline = time.monotonic() + timeout
        if overrides:
            self._wait_answers(deadline)
        else:
            self._wait_ready(deadline)

    def _wait_answers(self, deadline: float) -> None:
        """Until the NameNode answers JMX in safe mode (or already out of it)."""
        last: Exception | str = "not polled yet"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                state = self._jmx("FSNamesystemState").get("FSState")
                if state in ("safeMode", "Operational"):
                    return
                last = f"FSState {state!r}"
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(0.1)
        raise ConnectorError(f"the HDFS NameNode did not answer again in time: {last} "
                             f"(logs: {self._logs()})")

    def safe_mode(self) -> bool:
        """The NameNode is in safe mode now (its JMX says so)."""
        return self._jmx("FSNamesystemState").get("FSState") == "safeMode"

    def _jmx(self, bean: str) -> dict[str, Any]:
        url = f"{self.webhdfs_url}/jmx?qry=Hadoop:service=NameNode,name={bean}"
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - our loopback URL
            beans = json.load(r).get("beans") or [{}]
        found: dict[str, Any] = beans[0]
        return found

    def _last_error(self, daemon: str) -> str:
        """The daemon's last ERROR/FATAL log line (why it exited), or ''."""
        try:
            lines = Path(self.log_path(daemon)).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):  # ExitUtil names the exception that stopped it
            match = re.search(r"Exiting with status \d+: (.*)", line)
            if match:
                return match.group(1)
        for i in range(len(lines) - 1, -1, -1):
            if " ERROR " in lines[i] or " FATAL " in lines[i]:
                return " ".join(lines[i:i + 2])
        return ""

    def _check_alive(self) -> None:
        for daemon, proc in self._procs.items():
            if proc.poll() is not None:
                raise ConnectorError(
                    f"the HDFS {daemon} exited with code {proc.returncode} during start-up: "
                    f"{self._last_error(daemon) or 'no ERROR line logged'} (logs: {self._logs()})"
                )

    def _wait_ready(self, deadline: float) -> None:
        import hdfs

        client = hdfs.InsecureClient(self.webhdfs_url, timeout=5)
        probe = f"/.eo-ready-{uuid.uuid4().hex[:8]}"
        last: Exception | str = "not polled yet"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                state = self._jmx("FSNamesystemState")
                if state.get("FSState") != "Operational":
                    raise ConnectorError(f"NameNode in state {state.get('FSState')!r}")
                if int(state.get("NumLiveDataNodes", 0)) < 1:
                    raise ConnectorError("no live DataNode registered yet")
                # A registered DataNode takes writes once its storage is reported.
                client.write(probe, data=b"ready", overwrite=True)
                with client.read(probe) as reader:
                    if reader.read() != b"ready":
                        raise ConnectorError("WebHDFS read back different bytes")
                client.delete(probe)
                info = self._jmx("NameNodeInfo")
                self.version = str(info.get("SoftwareVersion") or self.version)
                return
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                last = e
                time.sleep(0.2)
        raise ConnectorError(
            f"HDFS (NameNode {self.webhdfs_url}) not ready in time: {last} (logs: {self._logs()})"
        )

    @property
    def pids(self) -> dict[str, int]:
        return {d: p.pid for d, p in self._procs.items()}

    def stop(self) -> None:
        """Stop the DataNode, then the NameNode (SIGTERM, SIGKILL after a grace period)."""
        for daemon in ("datanode", "namenode"):
            _stop(self._procs.pop(daemon, None), grace=10.0)
        if self._own_dir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalHdfs:
        return self.start() if not self._procs else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m tests.services.hdfs: start, report, stop
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with LocalHdfs(keep=True) as fs:
        print(f"HDFS {fs.version} up in {fs.started_in:.1f}s: {fs.webhdfs_url} "
              f"{fs.hdfs_url}, logs {fs.log_dir}")
