"""What an object store's errors mean, and which of them a retry outlasts
(``ObjectStoreStorage``; the retry budget is ``retry.py``'s).

Two layers retry, both within ``storage.retryTimeout`` and ``storage.maxRetries``:

1. obstore (Arrow's ``object_store``) retries each request itself: on 5xx answers (503
   SlowDown, 500 InternalError), on a connection refused, and on a connection dropped or
   timed out where the request is idempotent (reads, plain PUTs, multipart parts).
2. :func:`is_transient` then takes what obstore does not retry: a conditional create
   (``If-None-Match: *``) or a bulk delete whose connection was reset or timed out (obstore
   cannot know whether the server acted). The operation runs again; a create whose first
   try had succeeded is answered 412, which reads as "exists", and every caller reads the
   object back and compares (``wal._create_or_existing``): its own bytes are its own write.

An error obstore already retried until its budget ran out ("after N retries" with N at
``max_retries`` or the time past ``retry_timeout``) is not retried again, and neither is a
failed request to an instance-identity endpoint (no credentials is not a fault that passes).
Its message then says how long and how often obstore tried, and which option to raise.

A first contact (``ObjectStoreStorage._reach``) tells :func:`silent` errors (nothing
answered: refused, timed out, unresolvable) from :func:`answered` ones (any HTTP status):
only silence keeps a store unreached.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Hashable, Iterator
from typing import Any

from connectors.core.errors import StorageError
from connectors.core.storage.credentials import (
    CREDENTIAL_SOURCES,
    aws_files_looked_at,
    profile_secrets,
)
from connectors.core.storage.retry import Retried, RetryBudget

#: Where a store's credentials came from, when from the AWS shared files (for its errors).
CREDENTIALS_FROM: dict[Hashable, str] = {}
#: obstore's words for a connection lost mid-request or a request timed out: what it does
#: not retry for a request that is not idempotent (its debug source names the cause)
_LOST_MID_REQUEST = ("ConnectionReset", "ConnectionAborted", "BrokenPipe", "UnexpectedEof",
                     "TimedOut", "timed out", "IncompleteMessage",
                     "connection closed before message completed")


def _obstore_text(e: BaseException, debug: bool = False) -> str | None:
    """The message of an obstore error (with ``debug``, its debug dump too, which names the
    OS error underneath), None for any other."""
    try:
        from obstore.exceptions import BaseError
    except ImportError:  # pragma: no cover - obstore is a core dependency
        return None
    if not isinstance(e, BaseError):
        return None
    return str(e) if debug else str(e).split("Debug source", 1)[0]


def is_transient(e: BaseException) -> bool:
    """An obstore error that running the operation again can outlast (module docstring)."""
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    text = _obstore_text(e, debug=True)
    if text is None or _obstore_budget_spent(text) or _asked_identity(text):
        return False
    return any(marker in text for marker in _LOST_MID_REQUEST)


def _obstore_budget_spent(text: str) -> bool:
    """obstore gave up because its retry budget ran out (``in 90.1s, after 31 retries,
    max_retries: 100, retry_timeout: 90s``), not because the last try was a conditional
    create reset mid-request, which it does not retry whatever its budget."""
    m = re.search(r"in ([\d.]+)s, after (\d+) retries, max_retries: (\d+), "
                  r"retry_timeout: ([\d.]+)s", text)
    if m is None:
        return re.search(r"after \d+ retries", text) is not None
    seconds, tries, max_tries, timeout = (float(g) for g in m.groups())
    return tries >= max_tries or seconds >= timeout


def _spent(spent: list[Retried] | None, text: str = "",
           budget: RetryBudget | None = None) -> str:
    """The retries the storage layer made, or else those obstore made of the request (its
    message says "in 11.1s, after 15 retries"), with the option to raise."""
    if spent:
        return f" ({spent[0]})"
    m = re.search(r"in ([\d.]+)s, after (\d+) retries", text)
    if m is None or budget is None:
        return ""
    return f" ({Retried(int(m.group(2)) + 1, float(m.group(1)), budget)})"


#: A URL's scheme and authority in obstore's message (``Error performing PUT http://h:9/...``)
_ADDRESS = re.compile(r"\b(https?://[^/\s]+)")


def silent(e: BaseException) -> bool:
    """Nothing answered: the connection was refused, reset before any answer, timed out or
    never resolved. An instance-identity endpoint that is silent is not the store's
    silence (it has its own message: no credentials were found)."""
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    text = _obstore_text(e)
    return text is not None and not _asked_identity(text) and _status(text) is None \
        and _unreachable(text)


def answered(e: BaseException) -> bool:
    """The store answered, whatever it said (404, 403, 412, 5xx)."""
    from obstore.exceptions import (
        AlreadyExistsError,
        NotFoundError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    if isinstance(e, (AlreadyExistsError, NotFoundError, PermissionDeniedError,
                      PreconditionError, UnauthenticatedError, FileNotFoundError)):
        return True
    text = _obstore_text(e)
    return text is not None and not _asked_identity(text) and _status(text) is not None


def _status(text: str) -> int | None:
    m = re.search(r"status(?: code)?:? (\d{3})\b", text)
    return int(m.group(1)) if m else None


class ObjectStoreErrors:
    """The error half of :class:`~connectors.core.storage.object_store.ObjectStoreStorage`."""

    kind: str
    provider: str
    options: Any

    def url(self, path: str) -> str:
        raise NotImplementedError

    def identity(self) -> Hashable:
        raise NotImplementedError

    def _clean(self, e: BaseException) -> str:
        """obstore's message, first line only, the server's XML reduced to its code and
        message, and every secret value scrubbed."""
        text = str(e).split("\n\nDebug source", 1)[0]
        code = re.search(r"<Code>([^<]+)</Code>", text)
        message = re.search(r"<Message>([^<]+)</Message>", text)
        text = re.sub(r"<\?xml.*", "", text, flags=re.S).strip().rstrip(":")
        if code:
            text += f" ({code.group(1)}{': ' + message.group(1) if message else ''})"
        for secret in [*self.options.secrets(), *profile_secrets()]:
            if secret:
                text = text.replace(secret, "***")
        return text[:600]

    @contextlib.contextmanager
    def _errors(self, op: str, path: str, *, create: bool = False,
                spent: list[Retried] | None = None) -> Iterator[None]:
        """obstore's errors in this package's terms (``spent``: the retries this package
        made of the operation, named in the message when they ran out)."""
        from obstore.exceptions import (
            AlreadyExistsError,
            BaseError,
            NotFoundError,
            PermissionDeniedError,
            PreconditionError,
            UnauthenticatedError,
        )

        where = self.url(path)
        try:
            yield
        except (AlreadyExistsError, PreconditionError) as e:
            if create:
                raise FileExistsError(17, "exists", where) from None
            raise StorageError(f"{op} {where}: {self._clean(e)}") from None
        except (NotFoundError, FileNotFoundError) as e:  # obstore raises the builtin for 404
            text = self._clean(e)
            if "NoSuchBucket" in text or "ContainerNotFound" in text:
                raise StorageError(self._missing_bucket(text)) from None
            raise FileNotFoundError(2, f"{op}: not found", where) from None
        except UnauthenticatedError as e:
            raise StorageError(
                f"{self.kind}: {op} {where} was refused: the credentials{self._from()} were "
                f"not accepted ({self._clean(e)}); check storage.accessKeyId/secretAccessKey "
                "(or AWS_ACCESS_KEY_ID, the AWS profile, the instance role, "
                "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)") from None
        except PermissionDeniedError as e:
            text = self._clean(e)
            if _credentials_refused(text):
                raise StorageError(
                    f"{self.kind}: {op} {where} was refused: the credentials{self._from()} "
                    f"were not accepted ({text}); check storage.accessKeyId/secretAccessKey "
                    "(or AWS_ACCESS_KEY_ID, the AWS profile, the instance role, "
                    "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)") from None
            cause = "" if "(" in text.rsplit(":", 1)[-1] else (
                "the answer gave no reason (as for every HEAD request): either the "
                f"credentials{self._from()} are wrong or ")
            raise StorageError(
                f"{self.kind}: {op} {where} was denied ({text}); {cause}the role needs list, "
                "get, put and delete on this prefix (docs/deploying.md lists them)") from None
        except BaseError as e:
            text = self._clean(e)
            if "NoSuchBucket" in text or "ContainerNotFound" in text:
                raise StorageError(self._missing_bucket(text)) from None
            if _asked_identity(text):
                raise StorageError(self._no_credentials(op, where, text)) from None
            if _credentials_refused(text):
                raise StorageError(
                    f"{self.kind}: {op} {where} was refused: the credentials{self._from()} "
                    f"were not accepted ({text}); check storage.accessKeyId/secretAccessKey "
                    "(or the provider's environment, profile and identity)") from None
            if "builder error" in text:
                raise StorageError(
                    f"{self.kind}: {op} {where}: the client refused the endpoint "
                    f"{self.options.get('endpoint') or 'from the environment'}; an http:// "
                    "endpoint needs storage.allowHttp=true") from None
            budget = getattr(self, "budget", None)
            if _unreachable(text):
                raise StorageError(
                    f"{self.kind}: {op} {where}: the store is unreachable at "
                    f"{self._address(text)}, which answered this process before ({text}); "
                    "check that it is running and storage.endpoint, the network and the "
                    f"proxy{_spent(spent, text, budget)}") from None
            raise StorageError(f"{self.kind}: {op} {where} failed: "
                               f"{text}{_spent(spent, text, budget)}") from None

    def _address(self, text: str) -> str:
        """The endpoint a request went to: the options', else the one obstore names."""
        endpoint = self.options.get("endpoint")
        if endpoint:
            return str(endpoint)
        m = _ADDRESS.search(text)
        return m.group(1) if m else "its default endpoint"

    def _never_reached(self, op: str, path: str, e: Exception, attempts: int,
                       seconds: float) -> StorageError:
        """A first contact met only silence until ``storage.connectTimeout``."""
        text = self._clean(e)
        timeout = self.options.get("connectTimeout")
        retry = self.options.get("retryTimeout")
        return StorageError(
            f"{self.kind}: {op} {self.url(path)}: the store is unreachable at "
            f"{self._address(text)}: nothing answered this process's first contact within "
            f"storage.connectTimeout={timeout:g}s ({attempts} attempts over {seconds:.1f}s; "
            f"{text}). Check storage.endpoint (or AWS_ENDPOINT_URL and the region), the "
            "network and the proxy. A store that never answered is not waited for; once it "
            f"has answered, an outage is ridden through for storage.retryTimeout={retry:g}s")

    def _from(self) -> str:
        source = CREDENTIALS_FROM.get((self.identity(), self.options))
        return f" (from the AWS {source})" if source else ""

    def _no_credentials(self, op: str, where: str, text: str) -> str:
        """The client found no credentials and fell back to the instance identity, whose
        metadata endpoint gave none (refused, timed out, or no identity there)."""
        options, env, identity = CREDENTIAL_SOURCES[self.provider]
        files = f", nor in {aws_files_looked_at()}" if self.provider == "s3" else ""
        return (f"{self.kind}: {op} {where}: no credentials were found. None in the storage.* "
                f"options ({options}) nor in the environment ({env}){files}, and the "
                f"instance identity ({identity}) gave none: its metadata endpoint did not "
                f"answer with credentials ({text}). Give credentials in one of those places "
                "(docs/deploying.md, \"Credentials and endpoints\")")

    def _missing_bucket(self, text: str) -> str:
        return (f"{self.kind} does not exist ({text}); create it, or fix the bucket in "
                f"the path {self.url('/')}")


def _unknown_key(message: str) -> str:
    m = re.search(r"[Kk]ey:?\s*['\"`]([^'\"`]+)['\"`]", message)
    return m.group(1) if m else "?"


def _asked_identity(text: str) -> bool:
    """A failed request to an instance-identity endpoint (the last credential source)."""
    return any(path in text for path in (
        "/latest/api/token", "/latest/meta-data/iam", "/computeMetadata/",
        "/metadata/identity/oauth2/token"))


def _credentials_refused(text: str) -> bool:
    return any(code in text for code in (
        "InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthorizationHeaderMalformed",
        "InvalidToken", "ExpiredToken", "AuthenticationFailed", "invalid_grant"))


def _unreachable(text: str) -> bool:
    lowered = text.lower()
    return any(s in lowered for s in (
        "error sending request", "connection refused", "dns error", "timed out",
        "operation timed out", "connect error", "tcp connect", "no route to host",
        "failed to lookup address", "connection reset"))
