"""``storage.*`` options: how to reach an object store, declared once for every connector.

Every connector that keeps state or output in a directory (``walPath``, the file sink's
``path``) takes the same ``storage.*`` options. They only add to what the store's own
provider chain finds: the standard environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_NAME``, ...), the AWS CLI's
shared files and ``AWS_PROFILE`` (``credentials.py``), instance and workload identity
(EC2/ECS/EKS roles, GKE workload identity, Azure managed identity).

Besides the named options below, ``storage.<key>`` passes any configuration key of the
object store client (obstore, i.e. Rust's ``object_store``) through, e.g.
``storage.sse_kms_key_id``; a key the client does not know is an error, as is a named
option of another provider (``storage.accountKey`` with an ``s3://`` path).

The retry budget (``retryTimeout``, ``maxRetries``, ``retryBackoff``, ``retryBackoffMax``)
applies to every store, local disks and HDFS included: how long a storage operation that
failed transiently (a full disk, a NameNode restarting, a 503 SlowDown) is run again
(:mod:`connectors.core.storage.retry`). ``connectTimeout`` and ``requestTimeout`` apply to
every remote store (HDFS and object stores), ``connectTimeout`` also bounding the first
contact with a store this process has not reached (:mod:`connectors.core.contact`); every
other named option applies to object stores only. :func:`docs_table` is the table of
docs/deploying.md.

Secret values (``secretAccessKey``, ``sessionToken``, ``accountKey``, ``sasToken``,
``serviceAccountKey`` and any passed-through key whose name says secret/key/token) are kept
as :class:`~connectors.core.options.Secret`: never logged, never in an error or a ``repr``,
never written into a WAL, a log or a checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import OptionReader, Secret, closest, is_secret

PREFIX = "storage."


@dataclass(frozen=True)
class StorageOptionSpec:
    """One ``storage.*`` option: its name after the prefix, its kind, what it sets per
    provider (``client:``/``retry:`` targets the HTTP client and the retry policy), help."""

    name: str
    kind: str  # "string" | "secret" | "boolean" | "duration" | "integer"
    targets: Mapping[str, str]  # provider ("s3", "gcs", "azure", "*") -> config key
    help: str
    default: Any = None
    #: the kinds of store it applies to: "object" (S3, GCS, Azure), "hdfs", "local"
    stores: frozenset[str] = frozenset({"object"})
    minimum: float = 0.1  # durations in seconds, integers
    maximum: float = 3600


_REMOTE = frozenset({"object", "hdfs"})
_EVERY = frozenset({"object", "hdfs", "local"})


_ALL = "*"
#: The named options, declared once (docs/deploying.md's table is :func:`docs_table`).
STORAGE_OPTIONS: tuple[StorageOptionSpec, ...] = (
    StorageOptionSpec("endpoint", "string", {"s3": "endpoint", "azure": "endpoint",
                                             "gcs": "base_url"},
                      "the store's URL, for S3-compatible servers (MinIO, SeaweedFS, R2) "
                      "or private endpoints; default from AWS_ENDPOINT_URL or the provider"),
    StorageOptionSpec("region", "string", {"s3": "region"}, "the S3 bucket's region"),
    StorageOptionSpec("accessKeyId", "string", {"s3": "access_key_id"}, "S3 access key id"),
    StorageOptionSpec("secretAccessKey", "secret", {"s3": "secret_access_key"},
                      "S3 secret access key"),
    StorageOptionSpec("sessionToken", "secret", {"s3": "session_token"},
                      "S3 session token (temporary credentials)"),
    StorageOptionSpec("virtualHostedStyle", "boolean", {"s3": "virtual_hosted_style_request"},
                      "bucket.host URLs instead of host/bucket"),
    StorageOptionSpec("accountName", "string", {"azure": "account_name"},
                      "Azure storage account (az:// URLs carry none)"),
    StorageOptionSpec("accountKey", "secret", {"azure": "account_key"},
                      "Azure storage account key"),
    StorageOptionSpec("sasToken", "secret", {"azure": "sas_key"}, "Azure SAS token"),
    StorageOptionSpec("useEmulator", "boolean", {"azure": "use_emulator"},
                      "talk to Azurite on 127.0.0.1:10000"),
    StorageOptionSpec("serviceAccountPath", "string", {"gcs": "service_account"},
                      "path of a GCS service-account JSON file"),
    StorageOptionSpec("serviceAccountKey", "secret", {"gcs": "service_account_key"},
                      "GCS service-account JSON, inline"),
    StorageOptionSpec("allowHttp", "boolean", {_ALL: "client:allow_http"},
                      "allow http:// endpoints (default: true when the endpoint is http://)"),
    StorageOptionSpec("connectTimeout", "duration", {_ALL: "client:connect_timeout"},
                      "the TCP connect's timeout, and the bound on the first contact with a "
                      "store this process has not reached yet: an endpoint or NameNode where "
                      "nothing answers fails in this time, naming its address", 5.0,
                      _REMOTE),
    StorageOptionSpec("requestTimeout", "duration", {_ALL: "client:timeout"},
                      "timeout of one request (object stores; HDFS: of each read of its "
                      "answer)", 15.0, _REMOTE),
    StorageOptionSpec("retryTimeout", "duration", {_ALL: "retry:retry_timeout"},
                      "how long a storage operation that failed transiently (a full or "
                      "failing disk, a NameNode restarting or in safe mode, a DataNode "
                      "restarting, a store that answered before and is unreachable now, a "
                      "5xx or SlowDown answer) is run again, from its first failure. Sized "
                      "for a production NameNode's restart (its start-up, then at least 30 s "
                      "of safe mode) and an S3 server's", 120.0, _EVERY, minimum=0.0),
    StorageOptionSpec("maxRetries", "integer", {_ALL: "retry:max_retries"},
                      "how many times at most one storage operation is run again "
                      "(whichever budget runs out first ends the retries)", 100, _EVERY,
                      minimum=0, maximum=1000),
    StorageOptionSpec("retryBackoff", "duration", {_ALL: "retry:init_backoff"},
                      "the first pause between two tries; each next one doubles", 0.1, _EVERY,
                      minimum=0.01, maximum=60),
    StorageOptionSpec("retryBackoffMax", "duration", {_ALL: "retry:max_backoff"},
                      "the longest pause between two tries", 2.0, _EVERY, minimum=0.01,
                      maximum=300),
)
_STORES_SHOWN = {"object": "object stores", "hdfs": "HDFS", "local": "local paths"}
_BY_LOWER = {o.name.lower(): o for o in STORAGE_OPTIONS}
_PROVIDER_NAMES = {"s3": "Amazon S3", "gcs": "Google Cloud Storage", "azure": "Azure Blob"}


@dataclass(frozen=True)
class StorageOptions:
    """Parsed ``storage.*`` options (picklable, hashable; secrets as :class:`Secret`).

    ``values`` holds ``(name, value)`` pairs: named options by their declared name,
    passed-through client keys by the key as given (lower case).
    """

    values: tuple[tuple[str, Any], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.values)

    def __repr__(self) -> str:
        shown = {k: (v if not isinstance(v, Secret) else "***") for k, v in self.values}
        return f"StorageOptions({shown})"

    def get(self, name: str) -> Any:
        for k, v in self.values:
            if k == name:
                return v
        spec = _BY_LOWER.get(name.lower())
        return spec.default if spec else None

    def check_applies(self, store: str, family: str, shown: str) -> None:
        """Refuse an option that does not apply to a ``store`` path ("local", "hdfs"): every
        passed-through client key, and named options of object stores only."""
        for name, _ in self.values:
            spec = _BY_LOWER.get(name.lower())
            if spec is not None and store in spec.stores:
                continue
            where = "object store and HDFS" if spec is not None and "hdfs" in spec.stores \
                else "object store"
            everywhere = ", ".join(PREFIX + o.name for o in STORAGE_OPTIONS
                                   if o.stores == _EVERY)
            raise OptionError(
                f"{family}: option '{PREFIX}{name}' applies to {where} paths only, and "
                f"{shown!r} is not one; remove it, or use an s3://, gs:// or abfss:// path "
                f"(on every store: {everywhere})", option=PREFIX + name)

    def secrets(self) -> list[str]:
        """The secret values (to scrub them from any message that might echo one)."""
        return [v.get() for _, v in self.values if isinstance(v, Secret)]

    def resolve(self, provider: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """``(store config, client options, retry settings)`` for ``provider``, with the
        defaults applied; raises :class:`OptionError` for an option of another provider."""
        config: dict[str, Any] = {}
        client: dict[str, Any] = {}
        retry: dict[str, Any] = {}
        given = dict(self.values)
        for spec in STORAGE_OPTIONS:
            value = given.pop(spec.name, spec.default)
            if value is None:
                continue
            target = spec.targets.get(provider) or spec.targets.get(_ALL)
            if target is None:
                owners = sorted(_PROVIDER_NAMES[p] for p in spec.targets)
                raise OptionError(
                    f"option '{PREFIX}{spec.name}' applies to {', '.join(owners)} only, not "
                    f"to a {_PROVIDER_NAMES[provider]} path; remove it",
                    option=PREFIX + spec.name,
                )
            value = value.get() if isinstance(value, Secret) else value
            if target.startswith("client:"):
                client[target[7:]] = f"{value}s" if spec.kind == "duration" else value
            elif target.startswith("retry:"):
                retry[target[6:]] = value
            else:
                config[target] = value
        for key, value in given.items():  # passed-through client keys
            config[key] = value.get() if isinstance(value, Secret) else value
        if "allow_http" not in client:
            allow = _env_allow_http(provider)
            endpoint = str(config.get("endpoint") or config.get("base_url")
                           or _env_endpoint(provider) or "")
            if allow is not None:
                client["allow_http"] = allow
            elif endpoint.startswith("http://"):
                client["allow_http"] = True
        return config, client, retry


_ENV_PREFIX = {"s3": "AWS", "gcs": "GOOGLE", "azure": "AZURE"}


def _env_endpoint(provider: str) -> str | None:
    """The endpoint the provider's own chain would take from the environment."""
    names = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
             "azure": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
             "gcs": ("GOOGLE_BASE_URL",)}[provider]
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _env_allow_http(provider: str) -> bool | None:
    value = os.environ.get(f"{_ENV_PREFIX[provider]}_ALLOW_HTTP")
    return None if value is None else value.strip().lower() in ("1", "true", "yes")


def shown_default(spec: StorageOptionSpec) -> str:
    if spec.default is None:
        return ""
    if spec.kind == "duration":
        seconds = float(spec.default)
        return f"`{seconds * 1000:g}ms`" if seconds < 1 else f"`{seconds:g}s`"
    return f"`{spec.default}`"


def docs_table() -> str:
    """The ``storage.*`` options table of docs/deploying.md, from :data:`STORAGE_OPTIONS`."""
    rows = ["| option | applies to | default | meaning |", "|---|---|---|---|"]
    for spec in STORAGE_OPTIONS:
        if spec.stores == _EVERY:
            where = "every store, local paths included"
        elif "hdfs" in spec.stores:
            where = "object stores, HDFS"
        else:
            providers = {p for p in spec.targets if p != _ALL}
            where = ", ".join(sorted(_PROVIDER_NAMES[p] for p in providers)) \
                if providers else "object stores"
        rows.append(f"| `{PREFIX}{spec.name}` | {where} | {shown_default(spec)} | "
                    f"{spec.help} |")
    rows.append(f"| `{PREFIX}<key>` | object stores | | any other configuration key of the "
                "client (obstore, i.e. Arrow's `object_store`), e.g. `storage.sse_kms_key_id`; "
                "a key it does not know is an error |")
    return "\n".join(rows) + "\n"


def parse_storage_options(reader: OptionReader) -> StorageOptions:
    """Read every ``storage.*`` option of ``reader`` (the connector's own option reader, so
    unknown-option rules and "did you mean" stay the family's)."""
    values: list[tuple[str, Any]] = []
    for spec in STORAGE_OPTIONS:
        name = PREFIX + spec.name
        if spec.kind == "secret":
            value: Any = reader.secret(name)
        elif spec.kind == "boolean":
            value = reader.boolean(name, False) if reader.has(name) else None
        elif spec.kind == "duration":
            value = reader.duration(name, None, minimum=spec.minimum, maximum=spec.maximum)
        elif spec.kind == "integer":
            value = reader.integer(name, None, minimum=spec.minimum, maximum=spec.maximum)
        else:
            value = reader.string(name)
        if value is not None:
            values.append((spec.name, value))
    for key, raw in reader.prefixed(PREFIX).items():
        if key in _BY_LOWER:
            continue  # read above, by its declared name
        if not key.replace("_", "").isalnum():
            raise _unknown(reader.family, key)
        values.append((key, Secret(raw) if is_secret(key) else raw))
    return StorageOptions(tuple(values))


def storage_options_from(arguments: Mapping[str, Any] | None, family: str) -> StorageOptions:
    """The Python API's ``storage_options={"endpoint": ..., "region": ...}`` (names as in
    the ``storage.*`` options, without the prefix)."""
    if not arguments:
        return StorageOptions()
    reader = OptionReader({PREFIX + k: v for k, v in arguments.items()}, family=family)
    return parse_storage_options(reader)


def _unknown(family: str, key: str) -> OptionError:
    match = closest(key, [o.name for o in STORAGE_OPTIONS])
    hint = f" (did you mean '{PREFIX}{match}'?)" if match else ""
    return OptionError(
        f"{family}: unknown option '{PREFIX}{key}'{hint}; valid: "
        f"{[PREFIX + o.name for o in STORAGE_OPTIONS]} or a configuration key of the object "
        "store client",
        option=PREFIX + key,
    )


def unknown_storage_option(family: str, key: str) -> OptionError:
    """The error for a passed-through key the object store client refused."""
    return _unknown(family, key)
