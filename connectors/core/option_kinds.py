"""The kinds of a declared option (:mod:`connectors.core.declared`): how each is read from
Spark's strings, through :class:`~connectors.core.options.OptionReader`'s typed getters, and
how a Python argument of the kind is checked, with the same bounds and messages.

A Python argument given as a string is read exactly as the Spark option would be
(``flush_timeout="30s"``); a value of the kind's own type is checked against the same
bounds; anything else is refused naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from connectors.core.errors import OptionError
from connectors.core.options import (
    REDACTED,
    OptionReader,
    check_range,
    check_sink_id,
    is_secret,
    option_error,
)
from connectors.core.storage.options import (
    StorageOptions,
    parse_storage_options,
    storage_options_from,
)


class OptionSpec(Protocol):
    """What a kind reads of an option's declaration (:class:`connectors.core.declared.Opt`,
    which depends on this module, not the other way round)."""

    @property
    def default(self) -> Any: ...
    @property
    def minimum(self) -> float | None: ...
    @property
    def maximum(self) -> float | None: ...
    @property
    def above(self) -> float | None: ...
    @property
    def choices(self) -> tuple[str, ...]: ...


class Kind:
    """How one kind of option is read from Spark's strings and checked from Python."""

    #: what a value must be, in "must be <what>" messages
    what = "a string"
    #: the option is every Spark option under its name (``kafka.*``)
    prefix = False

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        """The option's value from Spark's strings, or None when it is not set."""
        return r.string(name)

    def python(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        """A Python argument's value (not None): a string is read as the Spark option would
        be; a value of the kind's own type is checked against the same bounds."""
        if isinstance(value, str):
            return self.spark(OptionReader({name: value}, family), name, opt)
        return self.native(value, name, opt, family)

    def native(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        raise wrong_type(family, name, value, self.what)

    def absent(self, opt: OptionSpec) -> Any:
        """The value of an option that is not set."""
        return opt.default

    def shown(self, value: Any) -> str:
        """The docs table's rendering of a default."""
        return f"`{value}`"


class _String(Kind):
    def python(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if not isinstance(value, str):
            raise wrong_type(family, name, value, self.what)
        return value.strip() or None


class _SinkId(_String):
    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        value = r.string(name)
        return None if value is None else check_sink_id(r.family, value, name)

    def python(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        value = super().python(value, name, opt, family)
        return None if value is None else check_sink_id(family, value, name)


class _Boolean(Kind):
    what = "a boolean"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return None if r.string(name) is None else r.boolean(name, False)

    def native(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if isinstance(value, int) and value in (0, 1):  # bool is an int
            return bool(value)
        raise wrong_type(family, name, value, self.what, "use True or False")

    def shown(self, value: Any) -> str:
        return "`true`" if value else "`false`"


class _Integer(Kind):
    what = "an integer"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return r.integer(name, None, minimum=opt.minimum, maximum=opt.maximum)

    def native(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong_type(family, name, value, self.what)
        check_range(family, name, value, opt.minimum, opt.maximum)
        return value


class _Duration(Kind):
    what = "a number of seconds"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return r.duration(name, None, minimum=opt.minimum, maximum=opt.maximum, above=opt.above)

    def native(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value)):
            raise wrong_type(family, name, value, self.what, "or a string such as '30s'")
        check_range(family, name, value, opt.minimum, opt.maximum, opt.above)
        return float(value)

    def shown(self, value: Any) -> str:
        seconds = float(value)
        if seconds < 1:
            return f"`{seconds * 1000:g}ms`"
        return f"`{seconds:g}s`"


class _Choice(Kind):
    what = "one of the valid values"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return r.choice(name, opt.choices, None)


class _CsvList(Kind):
    what = "a list of names or a comma-separated string"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return tuple(r.csv_list(name)) or None

    def native(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise wrong_type(family, name, value, self.what)
        return tuple(v.strip() for v in value if v.strip()) or None


class _Prefixed(Kind):
    """Every Spark option under a prefix (``kafka.*``), passed through with the prefix
    removed; in Python a mapping (keys without the prefix)."""

    what = "a mapping"
    prefix = True

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return r.prefixed(name)

    def python(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if not isinstance(value, Mapping):
            raise wrong_type(family, name, value, self.what)
        return value


class _Storage(Kind):
    """``storage.*`` (:mod:`connectors.core.storage.options`); in Python a mapping of the
    same names without the prefix."""

    what = "a mapping"
    prefix = True

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return parse_storage_options(r) or None

    def absent(self, opt: OptionSpec) -> Any:
        return StorageOptions()

    def python(self, value: Any, name: str, opt: OptionSpec, family: str) -> Any:
        if isinstance(value, StorageOptions):
            return value
        if not isinstance(value, Mapping):
            raise wrong_type(family, name, value, self.what)
        return storage_options_from(value, family)


STRING: Kind = _String()
SINK_ID: Kind = _SinkId()
BOOLEAN: Kind = _Boolean()
INTEGER: Kind = _Integer()
DURATION: Kind = _Duration()
CHOICE: Kind = _Choice()
CSV_LIST: Kind = _CsvList()
PREFIXED: Kind = _Prefixed()
STORAGE: Kind = _Storage()


def wrong_type(family: str, name: str, value: Any, what: str, valid: str = "") -> OptionError:
    shown = REDACTED if is_secret(name) else repr(value)[:100]
    return option_error(family, name, f"must be {what}, got {shown}",
                        valid or f"give {what}")
