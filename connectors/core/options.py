"""Parse Spark's string options into typed values, once, with errors that name the option.

Spark hands a data source its options as a case-insensitive ``str -> str`` mapping (it
lower-cases the keys). Each connector parses them exactly once into a frozen dataclass with
an :class:`OptionReader`::

    r = OptionReader(options, family="eo_kafka")
    servers = r.required("kafka.bootstrap.servers")
    max_rows = r.integer("maxOffsetsPerTrigger", None, minimum=1)
    r.exclusive("subscribe", "subscribePattern", "assign", required=True)
    r.refuse_unknown(prefixes=("kafka.",))   # raises on a typo; see below

The sinks declare their options once (:mod:`connectors.core.declared`) and read them through
these getters. An option nobody read is an error by default
(:meth:`OptionReader.refuse_unknown`): a typo such as ``transactionl=true`` would otherwise
change the guarantee without a word. The error names the option and the closest valid one.
Spark's own options (:data:`SPARK_OPTIONS`) and declared prefixes (``kafka.*``) pass; the
option ``ignoreUnknownOptions=true`` turns the error back into a warning.

Every error is an :class:`OptionError` that names the option with the user's spelling
(``startingOffsets``, not ``startingoffsets``), says what was wrong and what is valid, and
never repeats the value of a secret option (:mod:`connectors.core.secrets`).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.secrets import (  # noqa: F401 - re-exported: the options' secrets
    MIN_SCRUBBED,
    REDACTED,
    RedactedDict,
    Secret,
    is_secret,
    redact_url,
    scrub_known,
)

log = logging.getLogger(__name__)

#: Options Spark itself sets or reads on a source or sink: never "unknown".
SPARK_OPTIONS = ("checkpointLocation", "path", "queryName", "batchId",
                 "asyncProgressTrackingEnabled", "asyncProgressTrackingCheckpointIntervalMs")
IGNORE_UNKNOWN = "ignoreUnknownOptions"

#: What a ``sink_id`` may be: it names files, tables, recovery keys and transactional ids.
SINK_ID_RULE = "1-128 characters from A-Z a-z 0-9 . _ -, not starting with '.', no '..'"
_SINK_ID_RE = re.compile(r"^(?!\.)(?!.*\.\.)[A-Za-z0-9._-]{1,128}$")


def check_sink_id(family: str, sink_id: object, option: str = "sink_id") -> str:
    """``sink_id`` as given, or an :class:`OptionError` naming the safe charset."""
    if not isinstance(sink_id, str) or not _SINK_ID_RE.match(sink_id):
        shown = repr(sink_id) if isinstance(sink_id, str) and len(sink_id) <= 200 \
            else f"a value of {len(sink_id) if isinstance(sink_id, str) else 0} characters"
        raise OptionError(f"{family}: option '{option}' is not a valid sink id: {shown}; "
                          f"use {SINK_ID_RULE}", option=option)
    return sink_id

_DURATION_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_duration(text: str) -> float:
    """``"500ms"`` -> 0.5, ``"10s"``/``"10 seconds"`` -> 10.0, ``"2m"`` -> 120.0, ``"3"`` -> 3.0."""
    m = _DURATION_RE.match(text)
    if not m:
        raise ValueError(text)
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "":
        return number
    if unit not in _DURATION_UNITS:
        raise ValueError(text)
    return number * _DURATION_UNITS[unit]


class OptionReader:
    """Reads typed options from Spark's string map and remembers which ones it used.

    ``family`` (``eo_kafka``, ``eo_jdbc``, ...) prefixes error messages so a pipeline with
    several connectors says which one complained.
    """

    def __init__(self, options: Mapping[str, Any], family: str) -> None:
        self.family = family
        self._raw: dict[str, str] = {}
        self._spelling: dict[str, str] = {}
        for key, value in options.items():
            if value is None:
                continue
            lowered = str(key).lower()
            self._raw[lowered] = value if isinstance(value, str) else _stringify(value)
            self._spelling[lowered] = str(key)
        self._used: set[str] = set()
        # every name a getter asked for, in the connector's spelling: the valid options
        self._asked: dict[str, str] = {}

    # -- access -------------------------------------------------------------------------
    def present(self, name: str) -> bool:
        """Whether ``name`` was given, without making it a valid name of this connector
        (a deprecated spelling is looked for, never suggested)."""
        return name.lower() in self._raw

    def spelling(self, name: str) -> str:
        """``name`` as the user spelled it, when given (``name`` itself otherwise)."""
        return self._spelling.get(name.lower(), name)

    def has(self, name: str) -> bool:
        self._asked.setdefault(name.lower(), name)
        return name.lower() in self._raw

    def raw(self, name: str) -> str | None:
        key = name.lower()
        self._asked.setdefault(key, name)
        if key in self._raw:
            self._used.add(key)
            return self._raw[key]
        return None

    def error(self, name: str, problem: str, valid: str) -> OptionError:
        """Build the standard message: which option, what was wrong, what is valid."""
        return option_error(self.family, name, problem, valid)

    def _shown(self, name: str, value: str) -> str:
        return REDACTED if is_secret(name) else repr(value)

    # -- typed getters ------------------------------------------------------------------
    def required(self, name: str, hint: str = "") -> str:
        value = self.raw(name)
        if value is None or value.strip() == "":
            raise required_error(self.family, name, hint)
        return value.strip()

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        if value is None:
            return default
        value = value.strip()
        return value if value != "" else default

    def secret(self, name: str) -> Secret | None:
        value = self.raw(name)
        return None if value is None else Secret(value)

    def choice(self, name: str, choices: Iterable[str], default: str | None = None) -> str | None:
        allowed = list(choices)
        value = self.string(name)
        if value is None:
            return default
        for c in allowed:
            if value.lower() == c.lower():
                return c
        raise self.error(
            name, f"has invalid value {self._shown(name, value)}", f"valid values: {allowed}"
        )

    def integer(
        self,
        name: str,
        default: int | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> int | None:
        value = self.string(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise self.error(
                name,
                f"must be an integer, got {self._shown(name, value)}",
                bounds_text(minimum, maximum),
            ) from None
        check_range(self.family, name, number, minimum, maximum)
        return number

    def boolean(self, name: str, default: bool) -> bool:
        """``true``/``false`` (also ``yes``/``no``, ``on``/``off``, ``1``/``0``)."""
        value = self.string(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise self.error(
            name, f"must be a boolean, got {self._shown(name, value)}", "use 'true' or 'false'"
        )

    def duration(
        self,
        name: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
    ) -> float | None:
        """A duration in seconds, from ``"500ms"``, ``"10s"``, ``"5 minutes"`` or plain seconds;
        ``above`` is an exclusive lower bound (``above=0``: any positive duration)."""
        value = self.string(name)
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise self.error(
                name,
                f"is not a duration: {self._shown(name, value)}",
                "use a number with a unit such as '500ms', '10s', '5m' or '1h'",
            ) from None
        check_range(self.family, name, seconds, minimum, maximum, above)
        return seconds

    def json(self, name: str, default: Any = None, *, expect: type | None = None) -> Any:
        value = self.string(name)
        if value is None:
            return default
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            shown = "" if is_secret(name) else f" at position {e.pos}"
            raise self.error(name, f"is not valid JSON{shown}", "give a JSON document") from None
        if expect is not None and not isinstance(parsed, expect):
            raise self.error(
                name,
                f"must be a JSON {expect.__name__}, got {type(parsed).__name__}",
                f"give a JSON {expect.__name__}",
            )
        return parsed

    def csv_list(self, name: str) -> list[str]:
        value = self.string(name)
        if value is None:
            return []
        return [part.strip() for part in value.split(",") if part.strip()]

    def prefixed(self, prefix: str) -> RedactedDict:
        """All options that start with ``prefix`` (e.g. ``kafka.``), prefix removed.

        Keys keep Spark's lower-casing, which is what librdkafka expects anyway.
        """
        p = prefix.lower()
        self._asked.setdefault(p + "*", prefix + "*")
        out = RedactedDict()
        for key, value in self._raw.items():
            if key.startswith(p) and len(key) > len(p):
                self._used.add(key)
                out[key[len(p) :]] = value
        return out

    # -- groups and leftovers ------------------------------------------------------------
    def exclusive(self, *names: str, required: bool = False) -> str | None:
        """Exactly one (``required``) or at most one of ``names`` may be set; returns it."""
        present = [n for n in names if self.string(n) is not None]
        if len(present) > 1:
            raise OptionError(
                f"{self.family}: options {present} cannot be used together; set only one of "
                f"{list(names)}",
                option=present[0],
            )
        if required and not present:
            raise OptionError(
                f"{self.family}: one of the options {list(names)} is required, none was set",
                option=names[0],
            )
        return present[0] if present else None

    def unknown(self, prefixes: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[str]:
        skip = {i.lower() for i in ignore}
        pre = tuple(p.lower() for p in prefixes)
        return sorted(
            self._spelling[k]
            for k in self._raw
            if k not in self._used and k not in skip and not k.startswith(pre)
        )

    def refuse_unknown(self, prefixes: Iterable[str] = (),
                       ignore: Iterable[str] = ()) -> list[str]:
        """Refuse options nobody read (typos such as ``transactionl``), naming the closest
        valid one; with ``ignoreUnknownOptions=true``, log one warning instead and return
        them. Call it after every option was read."""
        lenient = self.boolean(IGNORE_UNKNOWN, False)
        # Spark adds 'path' for load(path)/save(path); sources that take it read it first.
        names = self.unknown(prefixes, ignore=tuple(ignore) + SPARK_OPTIONS)
        if not names:
            return names
        if lenient:
            log.warning("%s: ignoring unknown options %s (ignoreUnknownOptions=true)",
                        self.family, names)
            return names
        valid = sorted({v for k, v in self._asked.items() if k != IGNORE_UNKNOWN.lower()},
                       key=str.lower)
        hints = []
        for name in names:
            match = closest(name, valid)
            hints.append(f"'{name}'" + (f" (did you mean '{match}'?)" if match else ""))
        what = "option" if len(names) == 1 else "options"
        raise OptionError(
            f"{self.family}: unknown {what} {', '.join(hints)}; valid options: {valid} "
            f"(and Spark's own: {list(SPARK_OPTIONS[:3])}). A misspelled option would "
            f"silently change what the connector does; set {IGNORE_UNKNOWN}=true to only "
            "warn about unknown options",
            option=names[0],
        )

    def warn_unknown(self, prefixes: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[str]:
        """Deprecated name of :meth:`refuse_unknown` (it never only warned)."""
        warnings.warn("OptionReader.warn_unknown is deprecated; use refuse_unknown (it raises "
                      "unless ignoreUnknownOptions=true)", DeprecationWarning, stacklevel=2)
        return self.refuse_unknown(prefixes, ignore)

    def redacted(self) -> dict[str, str]:
        """The raw options with secret values replaced, safe to log."""
        return {self._spelling[k]: (REDACTED if is_secret(k) else v) for k, v in self._raw.items()}


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def option_error(family: str, name: str, problem: str, valid: str) -> OptionError:
    """The one message of a bad option: which option, what was wrong, what is valid.
    ``name`` is the option as the user wrote it (``walPath`` in Spark, ``wal_path`` in
    Python)."""
    return OptionError(f"{family}: option '{name}' {problem}; {valid}", option=name)


def required_error(family: str, name: str, hint: str = "") -> OptionError:
    extra = f" ({hint})" if hint else ""
    return option_error(family, name, "is required but was not set", f"set it{extra}")


def bounds_text(minimum: float | None, maximum: float | None,
                above: float | None = None) -> str:
    """What is valid: ``valid range is 1..10``, ``it must be >= 0``, ``it must be > 0``."""
    if minimum is not None and maximum is not None:
        return f"valid range is {minimum}..{maximum}"
    low = f">= {minimum}" if minimum is not None else f"> {above}" if above is not None else ""
    if low and maximum is not None:
        return f"it must be {low} and <= {maximum}"
    if low:
        return f"it must be {low}"
    if maximum is not None:
        return f"it must be <= {maximum}"
    return "give a number"


def check_range(family: str, name: str, number: float, lo: float | None, hi: float | None,
                above: float | None = None) -> None:
    """Raise the standard "out of range" error unless ``number`` is within the bounds."""
    if ((lo is not None and number < lo) or (hi is not None and number > hi)
            or (above is not None and number <= above)):
        raise option_error(family, name, f"is out of range ({number})",
                           bounds_text(lo, hi, above))


def stringify_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Python keyword arguments (``max_offsets=5``, ``failOnDataLoss=False``) -> Spark strings."""
    return {k: _stringify(v) for k, v in options.items() if v is not None}


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name ``name`` most likely meant: same letters ignoring case and
    underscores (``partitionBy`` -> ``partition_by``), else the closest spelling."""
    candidates = list(valid)

    def norm(text: str) -> str:
        return text.replace("_", "").lower()

    for v in candidates:
        if norm(v) == norm(name):
            return v
    close = difflib.get_close_matches(norm(name), [norm(v) for v in candidates], n=1,
                                      cutoff=0.6)
    return next((v for v in candidates if close and norm(v) == close[0]), None)
