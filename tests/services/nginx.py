"""nginx as an HTTP basic-auth reverse proxy in front of the session's schema registry.

Apicurio Registry 2.4.2's own authentication needs Keycloak (OIDC), which the test tier does
not have; a registry behind a reverse proxy that does basic auth is a common deployment, and
it answers a wrong or missing password with a real ``401 Unauthorized`` (nginx's
``auth_basic``). :class:`BasicAuthProxy` runs the Debian ``nginx`` binary (``nginx-light``,
which ``scripts/run-tests`` installs) in the foreground (``daemon off``) on a free loopback
port, with its own prefix, config, ``htpasswd``, logs and temp directories under its work
directory: no root and no system nginx needed. It passes every request, path and body
unchanged, to the upstream's ``scheme://host:port``, so the proxy's URL is the upstream's
with the proxy's host and port.
"""

from __future__ import annotations

import base64
import grp
import hashlib
import logging
import os
import pwd
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from connectors.core.errors import ConnectorError
from connectors.demo.services.kafka import free_port

log = logging.getLogger(__name__)


def nginx_binary() -> str | None:
    """The nginx executable: on PATH, or Debian's /usr/sbin (not on a user's PATH)."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def htpasswd_line(user: str, password: str) -> str:
    """One ``htpasswd`` line in the salted SHA-1 scheme nginx reads (``{SSHA}``)."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324 - nginx's scheme
    return f"{user}:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n"


class BasicAuthProxy:
    """nginx with ``auth_basic`` (one user) in front of ``upstream_url``; :attr:`url` is the
    same URL (path included) through the proxy."""

    def __init__(self, upstream_url: str, user: str, password: str, workdir: str) -> None:
        parts = urllib.parse.urlsplit(upstream_url)
        self.upstream = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + parts.path.rstrip("/")
        self.user, self.password = user, password
        self.workdir = Path(workdir)
        self.log_path = str(self.workdir / "error.log")
        self.version = "?"
        self._proc: subprocess.Popen[bytes] | None = None

    def _config(self) -> str:
        w = self.workdir
        # Under root the master hands the workers to `nobody`, who cannot enter pytest's
        # 0700 temp directories (htpasswd is read per request): keep them as this user.
        who = ""
        if os.geteuid() == 0:
            who = (f"user {pwd.getpwuid(os.getuid()).pw_name} "
                   f"{grp.getgrgid(os.getgid()).gr_name};\n")
        temps = "\n".join(f"  {kind}_temp_path {w / ('tmp-' + kind)};"
                          for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        return f"""{who}worker_processes 1;
pid {w / 'nginx.pid'};
error_log {self.log_path} notice;
events {{ worker_connections 64; }}
http {{
  access_log {w / 'access.log'};
{temps}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      auth_basic "eo-connectors test registry";
      auth_basic_user_file {w / 'htpasswd'};
      proxy_pass {self.upstream};
      proxy_set_header Authorization "";
      proxy_http_version 1.1;
    }}
  }}
}}
"""

    def start(self, timeout: float = 20.0) -> BasicAuthProxy:
        binary = nginx_binary()
        if binary is None:
            raise ConnectorError("no nginx binary (Debian: apt-get install nginx-light)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "htpasswd").write_text(htpasswd_line(self.user, self.password))
        conf = self.workdir / "nginx.conf"
        conf.write_text(self._config())
        self.version = _version(binary)
        began = time.monotonic()
        with open(self.workdir / "nginx.out", "ab") as out:
            # -e: the start-up error log too (the default /var/log/nginx is root's)
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv
                [binary, "-p", str(self.workdir), "-c", str(conf), "-e", self.log_path,
                 "-g", "daemon off;"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready(began + timeout)
        except BaseException:
            self.stop()
            raise
        log.info("nginx %s: basic auth in front of %s at %s, log %s", self.version,
                 self.upstream, self.url, self.log_path)
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Up when an unauthenticated request is refused with 401 (nginx answers, not the
        upstream)."""
        last = "not polled yet"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ConnectorError(f"nginx exited with code {self._proc.returncode} at "
                                     f"start-up: {_tail(self.log_path)}")
            try:
                urllib.request.urlopen(self.url + "/subjects", timeout=2)  # noqa: S310
                raise ConnectorError(f"nginx at {self.url} let a request without credentials "
                                     "through")
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise ConnectorError(f"nginx at {self.url} was not ready in time: {last} "
                             f"(log: {self.log_path}: {_tail(self.log_path)})")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "-v"], capture_output=True, text=True,  # noqa: S603
                             timeout=10).stderr
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.strip().rpartition("/")[2] or "?"


def _tail(path: str, lines: int = 5) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
