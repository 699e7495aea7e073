"""Object stores (S3, GCS, Azure Blob) through obstore, the Python binding of Rust's
``object_store``.

Why obstore: one well-kept client (Apache Arrow's ``object_store`` crate underneath) with
the same conditional create on all three stores (``PutMode::Create``: ``If-None-Match: *``
on S3 and Azure, ``ifGenerationMatch=0`` on GCS), the standard credential chains of each
(environment, instance/workload identity; for S3 also the AWS CLI's shared files, which
obstore does not read and ``credentials.py`` does), streaming multipart writes, bulk
deletes, bounded retries, and no JVM. boto3 has no GCS or Azure; fsspec's S3 backend
exposes no conditional create.

Paths inside a store are ``/key/with/slashes``; the bucket (or container) is part of the
backend, so :meth:`ObjectStoreStorage.url` gives back ``s3://bucket/key``. "Directories"
are key prefixes: :meth:`list` asks with a delimiter, :meth:`walk_files` without one.

What a protocol gets here:

- :meth:`create` is a conditional PUT: exactly one of two racing writers wins, the other
  gets ``FileExistsError``. A PUT the client retried after a lost answer can also report
  ``FileExistsError`` for an object it created itself; every caller reads the object back
  and compares, so that case reads as its own write.
- :meth:`open_write` streams a multipart upload that becomes visible only when the block
  exits normally; an exception aborts it (nothing visible).
- :meth:`rename` raises: object stores have no atomic rename (``atomic_rename = False``).

A bucket this process has not reached yet is first asked one HEAD through a client whose
timeouts and retries stop at ``storage.connectTimeout`` (:meth:`_reach`,
:func:`connectors.core.contact.first_contact`): an endpoint where nothing answers fails in
seconds, naming its address; once it has answered, every request goes through the client with
the long budget (``storage.retryTimeout``), which rides through the store's restarts.

Every request is counted per kind (:func:`request_counts`) for the benchmarks.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from datetime import timedelta
from typing import IO, Any, TypeVar

from connectors.core import contact
from connectors.core.errors import OptionError, StorageError
from connectors.core.storage import stats
from connectors.core.storage.base import CountingStream, Storage, is_hidden
from connectors.core.storage.credentials import AwsFilesError, apply_aws_profile
from connectors.core.storage.object_store_errors import (
    CREDENTIALS_FROM,
    ObjectStoreErrors,
    _unknown_key,
    answered,
    is_transient,
    silent,
)
from connectors.core.storage.options import StorageOptions, unknown_storage_option
from connectors.core.storage.retry import Retried, RetryBudget

log = logging.getLogger(__name__)

T = TypeVar("T")

#: URL scheme -> provider
PROVIDERS = {
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "az": "azure", "azure": "azure", "adl": "azure",
    "abfs": "azure", "abfss": "azure", "wasb": "azure", "wasbs": "azure",
}
_KIND = {"s3": "S3 bucket", "gcs": "GCS bucket", "azure": "Azure container"}
_BULK = 1000  # keys per bulk delete request (S3's limit; obstore splits further for Azure)

_REQUESTS: Counter[str] = Counter()
_REQUESTS_LOCK = threading.Lock()
_STORES: dict[Hashable, Any] = {}
_STORES_LOCK = threading.Lock()


def request_counts() -> dict[str, int]:
    """Requests this process sent to object stores, per kind (PUT, GET, HEAD, LIST, DELETE)."""
    with _REQUESTS_LOCK:
        return dict(_REQUESTS)


def reset_request_counts() -> None:
    with _REQUESTS_LOCK:
        _REQUESTS.clear()


def _count(kind: str, n: int = 1) -> None:
    with _REQUESTS_LOCK:
        _REQUESTS[kind] += n


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as e:  # pragma: no cover - obstore is a core dependency
        raise StorageError(
            "object store paths need the 'obstore' package: pip install pyspark-exactly-once"
        ) from e
    return obstore


class ObjectStoreStorage(ObjectStoreErrors, Storage):
    """One bucket (or Azure container) of an object store. Picklable: the client is built
    lazily once per process and configuration, from :class:`StorageOptions` plus the
    provider's own environment and credential chain."""

    atomic_rename = False

    def __init__(self, scheme: str, bucket: str, account: str | None,
                 options: StorageOptions, family: str = "storage") -> None:
        self.scheme = scheme
        self.provider = PROVIDERS[scheme]
        self.bucket = bucket
        self.account = account
        self.options = options
        self.family = family
        self.kind = f"{_KIND[self.provider]} '{bucket}'"
        self.budget = RetryBudget.of(options)

    def __repr__(self) -> str:
        return f"ObjectStoreStorage({self.url('/')!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectStoreStorage) and self.identity() == other.identity() \
            and self.options == other.options

    def __hash__(self) -> int:
        return hash(self.identity())

    def identity(self) -> Hashable:
        endpoint = self.options.get("endpoint")
        return (self.provider, endpoint, self.account, self.bucket)

    def url(self, path: str) -> str:
        if self.scheme in ("abfs", "abfss", "wasb", "wasbs"):
            host = "dfs" if self.scheme.startswith("abfs") else "blob"
            return f"{self.scheme}://{self.bucket}@{self.account}.{host}.core.windows.net{path}"
        return f"{self.scheme}://{self.bucket}{path}"

    # -- the client -----------------------------------------------------------------------------
    @property
    def store(self) -> Any:
        """The client with the long retry budget (``storage.retryTimeout``)."""
        return self._client(first=False)

    def _client(self, first: bool) -> Any:
        """The client of this process and configuration; ``first``: the one of a first
        contact, whose request timeout and retries end at ``storage.connectTimeout``."""
        key = (self.identity(), self.options, first)
        with _STORES_LOCK:
            store = _STORES.get(key)
            if store is None:
                store, source = self._build(first)
                _STORES[key] = store
                if source:
                    CREDENTIALS_FROM[(self.identity(), self.options)] = source
        return store

    def _build(self, first: bool = False) -> tuple[Any, str | None]:
        """The client, and where its credentials came from when from the AWS shared files."""
        _obstore()  # the install hint, if it is missing
        from obstore.exceptions import BaseError, UnknownConfigurationKeyError
        from obstore.store import AzureStore, GCSStore, S3Store

        config, client, retry = self.options.resolve(self.provider)
        if first:
            # A first contact waits for nothing longer than the connect timeout: one request
            # and obstore's retries of it (short pauses, so its last pause ends near it).
            seconds = self.first_contact_timeout
            client["timeout"] = f"{min(seconds, float(self.options.get('requestTimeout')))}s"
            retry = {**retry, "retry_timeout": seconds, "max_backoff": min(
                0.5, float(retry["max_backoff"]))}
        # The same budget as every store's (storage.retryTimeout, maxRetries, retryBackoff,
        # retryBackoffMax): obstore retries each request within it (object_store_errors).
        retry_config: dict[str, Any] = {
            "max_retries": int(retry["max_retries"]),
            "retry_timeout": timedelta(seconds=float(retry["retry_timeout"])),
            "backoff": {"init_backoff": timedelta(seconds=float(retry["init_backoff"])),
                        "max_backoff": timedelta(seconds=float(retry["max_backoff"])),
                        "base": 2},
        }
        if self.provider == "azure" and self.account and "account_name" not in config:
            config["account_name"] = self.account
        provider: Any = None
        source = None
        if self.provider == "s3":  # what `aws configure` wrote, which obstore does not read
            provider, source = apply_aws_profile(config, client)
            if provider is not None:
                config = {**provider.config, **config}
        settings: dict[str, Any] = {"config": config, "client_options": client,
                                    "retry_config": retry_config}
        try:
            if self.provider == "s3":
                return S3Store(self.bucket, credential_provider=provider, **settings), source
            if self.provider == "gcs":
                return GCSStore(self.bucket, **settings), source
            return AzureStore(self.bucket, **settings), source
        except UnknownConfigurationKeyError as e:
            key = _unknown_key(str(e))
            raise unknown_storage_option(self.family, key) from None
        except (BaseError, ValueError, TypeError) as e:
            raise StorageError(
                f"{self.kind}: cannot configure the {self.provider} client: "
                f"{self._clean(e)}") from None

    @property
    def first_contact_timeout(self) -> float:
        """``storage.connectTimeout``, and never more than the retry budget itself."""
        return min(float(self.options.get("connectTimeout")),
                   float(self.options.get("retryTimeout")) or 0.1)

    def _reach(self, op: str, path: str) -> None:
        """A first contact, unless the store answered this process before: one HEAD of
        ``path`` through the short client, where any answer counts (404, 403, 503); silence
        until ``storage.connectTimeout`` fails, naming the endpoint (module docstring)."""
        if contact.reached(self.identity()):
            return
        obstore = _obstore()
        key = self._key(path) or ".eo-contact"

        def ask(seconds: float) -> None:
            _count("HEAD")
            try:
                obstore.head(self._client(first=True), key)
            except Exception as e:
                if silent(e):
                    raise  # asked again until storage.connectTimeout
                if answered(e):
                    return
                with self._errors(op, path):  # the client's own verdict: no credentials
                    raise

        contact.first_contact(self.identity(), ask, timeout=self.first_contact_timeout,
                              fail=lambda e, n, s: self._never_reached(op, path, e, n, s))

    def check_options(self) -> None:
        """Build the client once, offline: a bad ``storage.*`` key fails at option time."""
        try:
            self.store  # noqa: B018 - builds and caches the client
        except AwsFilesError:
            raise  # the machine's files, not the options
        except StorageError as e:
            raise OptionError(f"{self.family}: the storage.* options do not configure a "
                              f"client: {e}", option="storage.*") from None

    # -- operations -----------------------------------------------------------------------------
    @staticmethod
    def _key(path: str) -> str:
        return path.strip("/")

    def _call(self, op: str, path: str, call: Callable[[], T], *, create: bool = False,
              kind: str | None = None) -> T:
        """``call()`` (an obstore request, counted as ``kind``) within the retry budget,
        its errors in this package's terms (``object_store_errors``)."""
        spent: list[Retried] = []

        def counted() -> T:
            if kind is not None:
                _count(kind)
            return call()

        def give_up(e: Exception, retried: Retried | None) -> BaseException | None:
            if retried is not None:
                spent.append(retried)
            return None

        self._reach(op, path)
        with self._errors(op, path, create=create, spent=spent):
            return self.budget.run(counted, transient=is_transient, give_up=give_up,
                                   what=lambda: f"{self.kind}: {op} {self.url(path)}",
                                   store=self.provider, op=op)

    def create(self, path: str, data: bytes) -> None:
        obstore = _obstore()
        try:
            self._call("create", path, lambda: obstore.put(
                self.store, self._key(path), data, mode="create", use_multipart=False),
                create=True, kind="PUT")
        except FileExistsError:
            stats.add(stats.CONFLICTS, self.provider, "create")
            raise

    def write_atomic(self, path: str, data: bytes) -> None:
        obstore = _obstore()
        self._call("write", path, lambda: obstore.put(
            self.store, self._key(path), data, mode="overwrite", use_multipart=False),
            kind="PUT")

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        obstore = _obstore()
        self._reach("write", path)
        _count("PUT")  # at least one; multipart adds a part per 10 MiB
        with self._errors("write", path):
            writer = obstore.open_writer(self.store, self._key(path))
            with writer:  # an exception inside aborts the upload: nothing becomes visible
                yield CountingStream(writer)  # type: ignore[misc]

    def read(self, path: str) -> bytes:
        obstore = _obstore()
        return self._call("read", path, lambda: bytes(
            obstore.get(self.store, self._key(path)).bytes()), kind="GET")

    def list(self, path: str) -> list[str]:
        obstore = _obstore()
        prefix = self._key(path)
        result = self._call("list", path, lambda: obstore.list_with_delimiter(
            self.store, prefix or None), kind="LIST")
        names = [p.rsplit("/", 1)[-1] for p in result["common_prefixes"]]
        names += [o["path"].rsplit("/", 1)[-1] for o in result["objects"]]
        return sorted(n for n in set(names) if n and not is_hidden(n))

    def _objects(self, path: str) -> builtins.list[dict[str, Any]]:
        """Every object below ``path`` (recursive), hidden ones included."""
        obstore = _obstore()
        prefix = self._key(path)
        def listing() -> builtins.list[dict[str, Any]]:
            out: builtins.list[dict[str, Any]] = []
            for chunk in obstore.list(self.store, prefix or None, chunk_size=1000):
                out.extend(chunk)
            return out

        out = self._call("list", path, listing)
        _count("LIST", max(1, -(-len(out) // 1000)))
        return out

    def walk_files(self, path: str) -> Iterator[str]:
        for o in self._objects(path):
            if not is_hidden(o["path"].rsplit("/", 1)[-1]):
                yield "/" + o["path"]

    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        raise StorageError(
            f"{self.kind}: cannot rename {self.url(src)} atomically: object stores have no "
            "atomic rename (this is a bug: protocols write final names on object stores)")

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        keys = [self._key(path)]
        if recursive:
            keys += [o["path"] for o in self._objects(path)]
        for i in range(0, len(keys), _BULK):
            # Azure answers 404 for a key that is gone (S3 does not); the bulk request still
            # deletes every other key, so a missing one is nothing to report.
            with contextlib.suppress(FileNotFoundError):
                self._delete_keys(path, keys[i:i + _BULK])
        return True

    def delete_many(self, paths: Iterable[str]) -> int:
        keys = [self._key(p) for p in paths]
        for i in range(0, len(keys), _BULK):
            with contextlib.suppress(FileNotFoundError):
                self._delete_keys("/" + keys[i], keys[i:i + _BULK])
        return len(keys)

    def _delete_keys(self, path: str, keys: builtins.list[str]) -> None:
        """One bulk delete (a delete run again finds some keys gone: nothing to report)."""
        obstore = _obstore()
        self._call("delete", path, lambda: obstore.delete(self.store, keys), kind="DELETE")

    def _head(self, path: str) -> dict[str, Any] | None:
        obstore = _obstore()
        try:
            meta: dict[str, Any] = self._call(
                "stat", path, lambda: obstore.head(self.store, self._key(path)), kind="HEAD")
            return meta
        except FileNotFoundError:
            return None

    def _has_children(self, path: str) -> bool:
        obstore = _obstore()

        def any_child() -> bool:
            for chunk in obstore.list(self.store, self._key(path) or None, chunk_size=1):
                if chunk:
                    return True
            return False

        return self._call("list", path, any_child, kind="LIST")

    def exists(self, path: str) -> bool:
        return self._head(path) is not None or self._has_children(path)

    def is_dir(self, path: str) -> bool:
        return self._key(path) == "" or self._has_children(path)

    def is_file(self, path: str) -> bool:
        """An object is at exactly this key and nothing is under it. Decided by the key
        itself, not by ``exists() and not is_dir()``: those are two listings, and a sink
        writing and removing an object under the prefix in between (two queries starting
        on one path) made an empty prefix look like a file."""
        return self._key(path) != "" and self._head(path) is not None \
            and not self._has_children(path)

    def size(self, path: str) -> int:
        meta = self._head(path)
        if meta is None:
            raise FileNotFoundError(2, "missing", self.url(path))
        return int(meta["size"])

    def mkdirs(self, path: str) -> None:
        """Object stores have no directories: a prefix exists once an object is under it."""


