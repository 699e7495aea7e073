"""A Confluent Schema Registry REST client: the few calls the formats need, with the
connectors' error rules (which URL, what went wrong, what is valid; no credentials in text).

:class:`RegistrySpec` is the parsed ``schemaRegistry.*`` options (picklable, secrets hidden
by ``repr``); :class:`RegistryClient` is built from it where it is used (the driver for the
reader schema, a worker for a writer schema id it has not seen) and caches what never
changes: a schema by id, a subject's version by number. ``latest`` is asked every time it is
resolved (once per query start), never per record.

It speaks the REST API every Confluent-compatible registry serves (Confluent's own,
Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda): ``GET /schemas/ids/{id}``,
``GET /subjects/{subject}/versions/{version}``. Plain ``urllib``: no client dependency, and
one deadline per call that covers connecting and reading.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import Secret, option_error, redact_url

log = logging.getLogger(__name__)

#: Every ``schemaRegistry.*`` key, with what it means (docs/schema-registry.md lists them).
REGISTRY_KEYS: dict[str, str] = {
    "url": "the registry's base URL (`http(s)://host:port[/path]`); several, comma-separated, "
    "are tried in order",
    "basic.auth.user.info": "`user:password` for HTTP basic authentication (a secret: never "
    "logged or shown)",
    "ssl.ca.location": "a PEM file of the CA certificates that sign the registry's certificate "
    "(default: the system's)",
    "ssl.certificate.location": "a PEM client certificate, for a registry that asks for one",
    "ssl.key.location": "the PEM private key of `ssl.certificate.location`",
    "ssl.key.password": "the password of `ssl.key.location` (a secret)",
    "timeout": "seconds one request may take, connecting included (default 30)",
}
DEFAULT_TIMEOUT = 30.0


class RegistryError(OptionError):
    """The registry refused or could not be reached (an :class:`OptionError`: the fix is in
    the ``schemaRegistry.*`` options, the subject or the registry)."""

    def __init__(self, message: str, *, status: int | None = None,
                 code: int | None = None) -> None:
        super().__init__(message, option="schemaRegistry.url")
        self.status = status
        self.code = code


@dataclass(frozen=True)
class RegistrySpec:
    """Where the registry is and how to authenticate (parsed ``schemaRegistry.*``)."""

    urls: tuple[str, ...]
    user_info: Secret | None = None
    ca_location: str | None = None
    cert_location: str | None = None
    key_location: str | None = None
    key_password: Secret | None = None
    timeout: float = DEFAULT_TIMEOUT
    #: the user's spelling of the option prefix, for messages
    prefix: str = field(default="schemaRegistry.", compare=False)
    #: ``user_info`` came from the URL (``http://user:password@host``), for messages
    credentials_in_url: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, family: str, values: Mapping[str, str],
              prefix: str = "schemaRegistry.") -> RegistrySpec:
        """From the ``schemaRegistry.*`` options (prefix removed, keys lower-case)."""
        known = {k.lower(): k for k in REGISTRY_KEYS}
        for name in values:
            if name.lower() not in known:
                from connectors.core.options import closest

                hint = closest(name, list(REGISTRY_KEYS))
                raise option_error(
                    family, prefix + name, "is not a schema registry setting",
                    (f"did you mean '{prefix}{hint}'? " if hint else "")
                    + "valid: " + ", ".join(prefix + k for k in REGISTRY_KEYS))
        get = {k.lower(): v for k, v in values.items()}.get
        raw_urls = (get("url") or "").strip()
        if not raw_urls:
            raise option_error(family, prefix + "url", "is required by a registry format",
                               "give the registry's base URL, e.g. 'http://localhost:8081'")
        urls = tuple(u.strip().rstrip("/") for u in raw_urls.split(",") if u.strip())
        in_url: set[str] = set()
        for u in urls:
            parts = urllib.parse.urlsplit(u)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise option_error(family, prefix + "url",
                                   f"has an invalid URL {redact_url(u)!r}",
                                   "give http(s)://host:port[/path]")
            if parts.username is not None:
                in_url.add(urllib.parse.unquote(parts.username) + ":"
                           + urllib.parse.unquote(parts.password or ""))
        user_info = get("basic.auth.user.info")
        from_url = bool(in_url)
        if from_url:
            # As confluent-kafka's client: a URL's user:password is the basic auth (urllib
            # would take it for part of the host name), given once.
            if user_info is not None or len(in_url) > 1:
                raise option_error(family, prefix + "url",
                                   "carries credentials, and so does "
                                   + (f"{prefix}basic.auth.user.info" if user_info is not None
                                      else "another of its URLs, different ones"),
                                   f"give user:password once, in {prefix}basic.auth.user.info "
                                   "or in the URL")
            user_info = in_url.pop()
            urls = tuple(_without_user_info(u) for u in urls)
        if user_info is not None and ":" not in user_info:
            raise option_error(family, prefix + "basic.auth.user.info",
                               "is not of the form user:password", "give 'user:password'")
        timeout_text = get("timeout")
        timeout = DEFAULT_TIMEOUT
        if timeout_text is not None:
            try:
                timeout = float(timeout_text)
            except ValueError:
                timeout = -1.0
            if not timeout > 0:
                raise option_error(family, prefix + "timeout",
                                   f"must be a positive number of seconds, got {timeout_text!r}",
                                   "e.g. 30")
        cert, key = get("ssl.certificate.location"), get("ssl.key.location")
        if (cert is None) != (key is None):
            missing = "ssl.key.location" if key is None else "ssl.certificate.location"
            raise option_error(family, prefix + missing,
                               "is required with the other half of the client certificate",
                               "set both ssl.certificate.location and ssl.key.location")
        password: str | None = get("ssl.key.password")
        return cls(
            urls=urls,
            user_info=Secret(user_info) if user_info is not None else None,
            ca_location=get("ssl.ca.location"),
            cert_location=cert,
            key_location=key,
            key_password=Secret(password) if password is not None else None,
            timeout=timeout,
            prefix=prefix,
            credentials_in_url=from_url,
        )

    def shown_urls(self) -> str:
        """The URLs for messages: never a password (in the URL or the options)."""
        return ", ".join(redact_url(u) for u in self.urls)


# -- the client --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegisteredSchema:
    """One schema of the registry: its global id, text and type (``AVRO`` by default)."""

    id: int
    schema: str
    schema_type: str = "AVRO"
    subject: str | None = None
    version: int | None = None
    references: tuple[Any, ...] = ()


class RegistryClient:
    """Calls to one registry (:class:`RegistrySpec`), caching what never changes."""

    def __init__(self, spec: RegistrySpec, family: str = "eo_kafka") -> None:
        self.spec = spec
        self.family = family
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_version: dict[tuple[str, int], RegisteredSchema] = {}
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    # -- requests ------------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext | None:
        if not any(u.startswith("https:") for u in self.spec.urls):
            return None
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=self.spec.ca_location)
            if self.spec.cert_location:
                ctx.load_cert_chain(
                    self.spec.cert_location, self.spec.key_location,
                    self.spec.key_password.get() if self.spec.key_password else None)
            self._ssl = ctx
        return self._ssl

    def request(self, method: str, path: str, body: Any = None,
                not_found: bool = False) -> Any:
        """One call, tried on each URL in turn; ``not_found=True`` returns None for a 404."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json",
                   "User-Agent": "eo-connectors"}
        if data is not None:
            headers["Content-Type"] = "application/vnd.schemaregistry.v1+json"
        if self.spec.user_info is not None:
            token = base64.b64encode(self.spec.user_info.get().encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        last: str = "no URL tried"
        began = time.monotonic()
        for base in self.spec.urls:
            url = base + path
            req = urllib.request.Request(url, data=data, headers=headers,  # noqa: S310
                                         method=method)
            try:
                with urllib.request.urlopen(  # noqa: S310 - the user's registry URL
                        req, timeout=self.spec.timeout, context=self._context()) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                detail = _error_body(e)
                if e.code == 404 and not_found:
                    return None
                if e.code in (401, 403):
                    raise RegistryError(self._refused(base, method, path, e.code, detail),
                                        status=e.code, code=detail["code"]) from None
                if e.code < 500:
                    raise RegistryError(
                        f"{self.family}: the schema registry at {redact_url(base)} answered "
                        f"{method} {path} with HTTP {e.code}: {detail['message']}",
                        status=e.code, code=detail["code"]) from None
                last = f"HTTP {e.code}: {detail['message']}"
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                reason = getattr(e, "reason", e)
                last = f"{type(reason).__name__}: {reason}"
        raise RegistryError(
            f"{self.family}: the schema registry is unreachable at {self.spec.shown_urls()} "
            f"({method} {path}, {time.monotonic() - began:.1f}s, timeout "
            f"{self.spec.timeout:g}s each): {last}; check {self.spec.prefix}url and that the "
            "registry is up")

    def _refused(self, base: str, method: str, path: str, status: int,
                 detail: dict[str, Any]) -> str:
        """HTTP 401/403: what was sent and which option to fix (never the credentials)."""
        option = f"{self.spec.prefix}basic.auth.user.info"
        if self.spec.user_info is None:
            sent, fix = "no credentials were sent", f"set {option} to user:password"
        else:
            in_url = f"the user:password in {self.spec.prefix}url"
            sent = f"{in_url if self.spec.credentials_in_url else option} was " + (
                "not accepted" if status == 401 else "accepted, but that user may not do this")
            fix = (f"correct it (or give it as {option} instead)"
                   if self.spec.credentials_in_url else "check its user and password")
        what = "unauthorized" if status == 401 else "forbidden"
        return (f"{self.family}: the schema registry at {redact_url(base)} refused {method} "
                f"{path} as {what} (HTTP {status}: {detail['message']}): {sent}; {fix}")

    # -- lookups -------------------------------------------------------------------------
    def schema_by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema of a global id (cached for good: an id never changes), None if unknown."""
        with self._lock:
            found = self._by_id.get(schema_id)
        if found is not None:
            return found
        doc = self.request("GET", f"/schemas/ids/{schema_id}", not_found=True)
        if doc is None:
            return None
        found = RegisteredSchema(
            id=schema_id, schema=doc["schema"], schema_type=doc.get("schemaType") or "AVRO",
            references=tuple(doc.get("references") or ()))
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def subject_version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        """A subject's schema at ``version`` (a number, or ``latest``, asked every time)."""
        if isinstance(version, int):
            with self._lock:
                cached = self._by_version.get((subject, version))
            if cached is not None:
                return cached
        path = (f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/"
                f"{urllib.parse.quote(str(version), safe='')}")
        doc = self.request("GET", path, not_found=True)
        if doc is None:
            subjects = self.request("GET", "/subjects", not_found=True) or []
            known = subject in subjects
            raise RegistryError(
                f"{self.family}: the schema registry at {self.spec.shown_urls()} has "
                + (f"no version {version} of subject {subject!r}" if known
                   else f"no subject {subject!r}")
                + "; register the schema first, or name another subject (subjects there: "
                + (", ".join(repr(s) for s in sorted(subjects)[:20]) or "none") + ")",
                status=404)
        found = RegisteredSchema(
            id=int(doc["id"]), schema=doc["schema"],
            schema_type=doc.get("schemaType") or "AVRO", subject=subject,
            version=int(doc["version"]), references=tuple(doc.get("references") or ()))
        with self._lock:
            self._by_version[(subject, found.version or 0)] = found
            self._by_id.setdefault(found.id, found)
        return found


def _without_user_info(url: str) -> str:
    """``http://user:password@host:port/path`` -> ``http://host:port/path``."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _error_body(e: urllib.error.HTTPError) -> dict[str, Any]:
    """Confluent's error body ``{"error_code": 40401, "message": "..."}``, or the status."""
    try:
        doc = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        doc = {}
    message = str(doc.get("message") or e.reason or "")
    return {"code": doc.get("error_code"), "message": message[:300]}


#: One client per registry spec and process (driver or worker): the id cache is shared by
#: every task the worker runs.
_CLIENTS: dict[RegistrySpec, RegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(spec: RegistrySpec, family: str = "eo_kafka") -> RegistryClient:
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(spec)
        if found is None:
            found = _CLIENTS[spec] = RegistryClient(spec, family)
        return found
