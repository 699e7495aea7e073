"""An in-process WebHDFS **protocol double** for tests without a real NameNode.

This is not HDFS. It is an HTTP server that implements the documented WebHDFS REST
operations our HDFS backend uses, with the same wire protocol and the HDFS semantics those
operations have (https://hadoop.apache.org/docs/stable/hadoop-project-dist/hadoop-hdfs/WebHDFS.html):

- ``PUT ?op=CREATE``: two steps, as on a real cluster. The NameNode step answers
  ``307 Temporary Redirect`` with a ``Location`` on a "DataNode" URL and stores nothing; the
  client then PUTs the bytes there and gets ``201 Created``. ``overwrite=false`` on an
  existing file is a ``FileAlreadyExistsException`` (403).
- ``GET ?op=OPEN`` (307 to the DataNode, which streams the bytes; ``offset``/``length``),
  ``PUT ?op=RENAME`` (``{"boolean": false}`` when the target exists as a file or its parent
  is missing; into the directory when the target is a directory), ``DELETE ?op=DELETE``
  (``recursive``), ``PUT ?op=MKDIRS``, ``GET ?op=LISTSTATUS``, ``GET ?op=GETFILESTATUS``
  (404 ``FileNotFoundException`` when missing).

A real endpoint replaces it whenever ``WEBHDFS_URL`` is set (see ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

PREFIX = "/webhdfs/v1"


class _Namespace:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.mtimes: dict[str, int] = {}
        self.dirs: set[str] = {"/"}
        self.lock = threading.RLock()
        self.ops: list[str] = []  # every operation seen, for tests that check the protocol

    def parent_ok(self, path: str) -> bool:
        return posixpath.dirname(path) in self.dirs

    def mkdirs(self, path: str) -> None:
        parts = [p for p in path.split("/") if p]
        cur = "/"
        for p in parts:
            cur = posixpath.join(cur, p)
            if cur in self.files:
                raise FileExistsError(cur)
            self.dirs.add(cur)

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = set()
        for p in list(self.files) + list(self.dirs):
            if p != path and p.startswith(prefix) and "/" not in p[len(prefix):]:
                names.add(p[len(prefix):])
        return sorted(names)

    def status(self, path: str) -> dict[str, Any] | None:
        name = posixpath.basename(path)
        if path in self.files:
            return {"pathSuffix": name, "type": "FILE", "length": len(self.files[path]),
                    "modificationTime": self.mtimes.get(path, 0), "blockSize": 134217728,
                    "replication": 1, "permission": "644", "owner": "test", "group": "test",
                    "accessTime": 0, "fileId": abs(hash(path)) % 10**9, "childrenNum": 0}
        if path in self.dirs:
            return {"pathSuffix": name, "type": "DIRECTORY", "length": 0,
                    "modificationTime": 0, "blockSize": 0, "replication": 0,
                    "permission": "755", "owner": "test", "group": "test", "accessTime": 0,
                    "fileId": abs(hash(path)) % 10**9,
                    "childrenNum": len(self.children(path))}
        return None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        return

    # -- plumbing ------------------------------------------------------------------------
    def _parse(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        if not parts.path.startswith(PREFIX):
            raise _Remote(404, "IllegalArgumentException", f"not a WebHDFS path: {parts.path}")
        path = posixpath.normpath(unquote(parts.path[len(PREFIX):]) or "/")
        query = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
        return path, query

    def _send(self, code: int, body: bytes = b"", ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, code: int, doc: Any) -> None:
        self._send(code, json.dumps(doc).encode())

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self, method: str) -> None:
        try:
            path, q = self._parse()
            op = q.get("op", "").upper()
            self.server.ns.ops.append(f"{method} {op} {path}")
            handler = getattr(self, f"_{method.lower()}_{op.lower()}", None)
            if handler is None:
                raise _Remote(400, "UnsupportedOperationException", f"{method} op={op}")
            handler(path, q)
        except _Remote as e:
            self._json(e.code, {"RemoteException": {"exception": e.exception,
                                                    "javaClassName": f"java.io.{e.exception}",
                                                    "message": e.message}})

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._dispatch("GET")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _redirect(self, path: str, q: dict[str, str]) -> None:
        self._body()  # a client may send a body to the NameNode step; drain it
        query = "&".join(f"{k}={quote(v)}" for k, v in q.items()) + "&datanode=true"
        location = f"{self.server.url}{PREFIX}{quote(path)}?{query}"
        self._send(307, b"", headers={"Location": location})

    # -- operations ----------------------------------------------------------------------
    def _put_create(self, path: str, q: dict[str, str]) -> None:
        ns = self.server.ns
        if q.get("datanode") != "true":
            with ns.lock:
                if path in ns.dirs:
                    raise _Remote(403, "FileAlreadyExistsException", f"{path} is a directory")
                if path in ns.files and q.get("overwrite", "false").lower() != "true":
                    raise _Remote(403, "FileAlreadyExistsException", f"{path} already exists")
            self._redirect(path, q)
            return
        data = self._body()
        with ns.lock:
            if path in ns.files and q.get("overwrite", "false").lower() != "true":
                raise _Remote(403, "FileAlreadyExistsException", f"{path} already exists")
            ns.mkdirs(posixpath.dirname(path))
            ns.files[path] = data
            ns.mtimes[path] = int(time.time() * 1000)
        self._send(201, b"", headers={"Location": f"hdfs://double{path}"})

    def _get_open(self, path: str, q: dict[str, str]) -> None:
        ns = self.server.ns
        with ns.lock:
            if path not in ns.files:
                raise _Remote(404, "FileNotFoundException", f"File {path} does not exist.")
            data = ns.files[path]
        if q.get("datanode") != "true":
            self._redirect(path, q)
            return
        offset = int(q.get("offset", 0))
        length = q.get("length")
        chunk = data[offset:] if length is None else data[offset:offset + int(length)]
        self._send(200, chunk, ctype="application/octet-stream")

    def _put_mkdirs(self, path: str, q: dict[str, str]) -> None:
        with self.server.ns.lock:
            try:
                self.server.ns.mkdirs(path)
            except FileExistsError as e:
                raise _Remote(403, "FileAlreadyExistsException", f"{e} is a file") from None
        self._json(200, {"boolean": True})

    def _put_rename(self, path: str, q: dict[str, str]) -> None:
        ns = self.server.ns
        dst = posixpath.normpath(unquote(q.get("destination", "")))
        with ns.lock:
            ok = self._rename(ns, path, dst)
        self._json(200, {"boolean": ok})

    @staticmethod
    def _rename(ns: _Namespace, src: str, dst: str) -> bool:
        if src not in ns.files and src not in ns.dirs:
            return False
        if dst in ns.dirs:  # HDFS moves into an existing directory
            dst = posixpath.join(dst, posixpath.basename(src))
        if dst in ns.files or dst in ns.dirs or not ns.parent_ok(dst):
            return False
        if src in ns.files:
            ns.files[dst] = ns.files.pop(src)
            ns.mtimes[dst] = ns.mtimes.pop(src, 0)
            return True
        prefix = src.rstrip("/") + "/"
        for p in [p for p in ns.files if p.startswith(prefix)]:
            ns.files[dst + p[len(src):]] = ns.files.pop(p)
        for d in [d for d in ns.dirs if d == src or d.startswith(prefix)]:
            ns.dirs.discard(d)
            ns.dirs.add(dst + d[len(src):])
        return True

    def _delete_delete(self, path: str, q: dict[str, str]) -> None:
        ns = self.server.ns
        recursive = q.get("recursive", "false").lower() == "true"
        with ns.lock:
            if path in ns.files:
                del ns.files[path]
                self._json(200, {"boolean": True})
                return
            if path not in ns.dirs or path == "/":
                self._json(200, {"boolean": False})
                return
            if ns.children(path) and not recursive:
                raise _Remote(403, "PathIsNotEmptyDirectoryException", f"{path} is non empty")
            prefix = path.rstrip("/") + "/"
            for p in [p for p in ns.files if p.startswith(prefix)]:
                del ns.files[p]
            for d in [d for d in ns.dirs if d == path or d.startswith(prefix)]:
                ns.dirs.discard(d)
        self._json(200, {"boolean": True})

    def _get_getfilestatus(self, path: str, q: dict[str, str]) -> None:
        with self.server.ns.lock:
            status = self.server.ns.status(path)
        if status is None:
            raise _Remote(404, "FileNotFoundException", f"File does not exist: {path}")
        status["pathSuffix"] = ""
        self._json(200, {"FileStatus": status})

    def _get_liststatus(self, path: str, q: dict[str, str]) -> None:
        ns = self.server.ns
        with ns.lock:
            status = ns.status(path)
            if status is None:
                raise _Remote(404, "FileNotFoundException", f"File {path} does not exist.")
            if status["type"] == "FILE":
                entries = [dict(status, pathSuffix="")]
            else:
                entries = [ns.status(posixpath.join(path, n)) for n in ns.children(path)]
        self._json(200, {"FileStatuses": {"FileStatus": entries}})


class _Remote(Exception):
    def __init__(self, code: int, exception: str, message: str) -> None:
        super().__init__(message)
        self.code, self.exception, self.message = code, exception, message


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ns: _Namespace
    url: str


class WebHdfsDouble:
    """``with WebHdfsDouble() as d: d.url`` -> ``http://127.0.0.1:<port>``."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.ns = _Namespace()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._server.url = self.url
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def namespace(self) -> _Namespace:
        return self._server.ns

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> WebHdfsDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebHdfsDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
