"""Secrets in options: which names are secret, and how their values stay out of text.

- :func:`is_secret`: the option and librdkafka property names whose values are never logged,
  echoed in an error, shown by ``repr()`` or written to state;
- :class:`RedactedDict` (a configuration map whose ``repr`` hides them) and :class:`Secret`
  (one secret value);
- :func:`scrub_known`: text we did not write (librdkafka's log lines and error strings)
  without any secret value a :class:`RedactedDict` of this process held;
- :func:`redact_url`: a URL without its password.

:mod:`connectors.core.options` re-exports all of them.
"""

from __future__ import annotations

import re
from typing import Any

# Option names whose values must never be logged, echoed in errors or shown in repr().
# Among them every property librdkafka's CONFIGURATION.md marks sensitive: sasl.password,
# ssl.key.password, ssl.key.pem, ssl_key, ssl.keystore.password, sasl.oauthbearer.config,
# sasl.oauthbearer.client.secret (and its client.credentials alias), and the assertion's
# private.key.pem / private.key.passphrase.
_SECRET_PATTERN = re.compile(
    r"(password|passwd|passphrase|secret|token|sasl\.jaas|ssl[._]key|private[._]key|user[._]info"
    r"|oauthbearer\.config|credential|api[._-]?key)", re.I
)
REDACTED = "***"


def is_secret(name: str) -> bool:
    """True when an option or config key names a secret (passwords, SASL JAAS, keys)."""
    return bool(_SECRET_PATTERN.search(name))


def redact_url(url: str) -> str:
    """``scheme://user:pass@host/db`` -> ``scheme://user:***@host/db``; also ``password=`` args."""
    url = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1" + REDACTED + "@", url)
    return re.sub(r"(?i)(password=)[^&;\s]*", r"\1" + REDACTED, url)


#: Secret values this process has held in a :class:`RedactedDict` (bounded), so that text
#: from outside (librdkafka's log lines and error strings) can be scrubbed of them.
_KNOWN_SECRETS: set[str] = set()
_KNOWN_SECRETS_MAX = 1000
#: Shorter secret values are not scrubbed from text: they would garble it.
MIN_SCRUBBED = 3


def _remember(key: object, value: object) -> None:
    text = str(value) if value is not None else ""
    if (is_secret(str(key)) and len(text) >= MIN_SCRUBBED
            and len(_KNOWN_SECRETS) < _KNOWN_SECRETS_MAX):
        _KNOWN_SECRETS.add(text)


def scrub_known(text: str) -> str:
    """``text`` with every secret value a :class:`RedactedDict` of this process held
    replaced by ``***`` (for text we did not write: librdkafka's logs and errors)."""
    for value in sorted(_KNOWN_SECRETS, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


class RedactedDict(dict[str, str]):
    """A plain dict (librdkafka takes it as is) whose repr hides secret values, and whose
    secret values :func:`scrub_known` removes from text (also after unpickling on an
    executor)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for k, v in self.items():
            _remember(k, v)

    def __setitem__(self, key: str, value: str) -> None:
        _remember(key, value)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: str, default: str = "") -> str:  # type: ignore[override]
        if key not in self:
            self[key] = default
        return self[key]

    def __reduce__(self) -> tuple[Any, ...]:
        return (RedactedDict, (dict(self),))

    def __repr__(self) -> str:
        shown = {k: (REDACTED if is_secret(k) else v) for k, v in self.items()}
        return repr(shown)

    __str__ = __repr__


class Secret:
    """A secret string: ``repr``/``str`` show ``***``; ``.get()`` returns the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))
