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
from connectors.core.storage.retry import Retried

#: Where a store's credentials came from, when from the AWS shared files (for its errors).
CREDENTIALS_FROM: dict[Hashable, str] = {}
#: obstore's words for a connection lost mid-request or a request timed out: what it does
#: not retry for a request that is not idempotent (its debug source names the cause)
_LOST_MID_REQUEST = ("ConnectionReset", "ConnectionAborted", "BrokenPipe", "UnexpectedEof",
                     "TimedOut", "timed out", "IncompleteMessage",
                     "connection closed before message completed")


def is_transient(e: BaseException) -> bool:
    """An obstore error that running the operation again can outlast (module docstring)."""
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    try:
        from obstore.exceptions import BaseError
    except ImportError:  # pragma: no cover - obstore is a core dependency
        return False
    if not isinstance(e, BaseError):
        return False
    text = str(e)
    if _obstore_budget_spent(text) or _asked_identity(text):
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


def _spent(spent: list[Retried] | None) -> str:
    return f" ({spent[0]})" if spent else ""


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
            if _unreachable(text):
                raise StorageError(
                    f"{self.kind}: {op} {where}: the store is unreachable at "
                    f"{self.options.get('endpoint') or 'its default endpoint'} ({text}); "
                    f"check storage.endpoint, the network and the proxy{_spent(spent)}") from None
            raise StorageError(f"{self.kind}: {op} {where} failed: {text}{_spent(spent)}") from None

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
