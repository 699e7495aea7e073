"""Options declared once per connector, and everything that derives from the declaration.

Each sink lists its options once, as a tuple of :class:`Opt` beside its options class
(``KAFKA_SINK_OPTIONS``, ``JDBC_SINK_OPTIONS``, ``FILE_SINK_OPTIONS``): the Spark option
name, the Python argument, the kind (:mod:`connectors.core.option_kinds`), the default, the
bounds and the help. From the table:

- :meth:`Declared.from_options` reads Spark's string options through
  :class:`~connectors.core.options.OptionReader`'s typed getters and refuses unknown ones;
- :meth:`Declared.create` checks the Python API's arguments against the same kinds and
  bounds (a string is read exactly as the Spark option would be), errors naming the argument;
- both give one :class:`Values` (``{argument: value}``, defaults applied), and the sink's
  one ``_build(values)`` makes the cross-field checks and the frozen spec: one direction;
- :func:`checked_arguments`: a misspelled keyword of the constructor, with the closest name;
- :func:`docs_table`: the options table of the sink's page in ``docs/``;
- :func:`signature_mismatches`: where a constructor's explicit signature (kept for IDEs and
  ``help()``) differs from its table; a unit test keeps it empty.

Rules every table follows:

- **Durations** are seconds (a float) in Python and a number with a unit (``500ms``, ``30s``,
  ``5m``) or plain seconds in Spark; no name carries a unit (``flush_timeout`` /
  ``flushTimeout``), and the bound on retrying is a ``retryTimeout`` (``metadataRetryTimeout``
  where only metadata requests are retried).
- **sink_id**: every sink takes ``sink_id``, and in Spark also ``sinkId``
  (:func:`sink_id_option`).
- **Renames** keep the old name working (:attr:`Opt.deprecated`, :attr:`Opt.deprecated_args`)
  with a ``DeprecationWarning`` that names the new one.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar, TypeVar, cast

from connectors.core.errors import OptionError, UnknownArgumentError
from connectors.core.option_kinds import (  # noqa: F401 - the kinds a table names
    BOOLEAN,
    CHOICE,
    CSV_LIST,
    DURATION,
    INTEGER,
    PREFIXED,
    SINK_ID,
    STORAGE,
    STRING,
    Kind,
)
from connectors.core.options import OptionReader, closest, option_error, required_error

T = TypeVar("T")


# -- the declaration --------------------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """One option of one connector, declared once."""

    #: Spark's option name (``walPath``); for :data:`PREFIXED`, the prefix (``kafka.``);
    #: for :data:`STORAGE`, ``storage.``
    spark: str
    #: the Python argument (``wal_path``)
    arg: str
    kind: Kind
    #: the value when the option is not set (Python's default argument)
    default: Any = None
    #: what it does (the docs table's last column; markdown)
    help: str = ""
    required: bool = False
    #: what to set, in the "is required" message
    hint: str = ""
    minimum: float | None = None
    maximum: float | None = None
    #: an exclusive lower bound (``above=0``: positive)
    above: float | None = None
    #: :data:`CHOICE`: the valid values (matched ignoring case)
    choices: tuple[str, ...] = ()
    #: further Spark spellings, as valid as ``spark`` (``sinkId``)
    aliases: tuple[str, ...] = ()
    #: former Spark names: they work and warn (``retryDeadline``)
    deprecated: tuple[str, ...] = ()
    #: former Python arguments: they work and warn (``retry_deadline``)
    deprecated_args: tuple[str, ...] = ()
    #: the docs table's default, where the value alone says too little
    shown_default: str | None = None
    #: added to the docs table's Python column
    arg_note: str = ""


def sink_id_option(required: bool, help: str, hint: str = "") -> Opt:
    """``sink_id``, the same in every sink: Spark also takes ``sinkId``; the charset of
    :func:`~connectors.core.options.check_sink_id`."""
    return Opt("sink_id", "sink_id", SINK_ID, None, help, required=required, hint=hint,
               aliases=("sinkId",), shown_default=None if required else "none")


class Values(Mapping[str, Any]):
    """One connector's option values by Python argument, defaults applied, from either entry
    point; :meth:`error` names an option the way its user spelled it."""

    def __init__(self, family: str, values: dict[str, Any], names: dict[str, str]) -> None:
        self.family = family
        self._values = values
        self._names = names

    def __getitem__(self, arg: str) -> Any:
        return self._values[arg]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def name(self, arg: str) -> str:
        """``walPath`` when the value came from Spark, ``wal_path`` from Python."""
        return self._names[arg]

    def error(self, arg: str, problem: str, valid: str) -> OptionError:
        return option_error(self.family, self.name(arg), problem, valid)

    def build(self, spec: type[T], used: tuple[str, ...] = (), **derived: Any) -> T:
        """``spec(...)``: each field the value of the argument of its name, unless ``derived``
        gives it. Every value must land in a field or be named in ``used`` (read into a
        derived field), so a declared option cannot be dropped on the way."""
        fields = {f.name for f in dataclasses.fields(spec)}  # type: ignore[arg-type]
        lost = [k for k in self._values if k not in fields and k not in used]
        if lost:
            raise TypeError(f"{spec.__name__}: declared options {lost} reach no field")
        same = {k: v for k, v in self._values.items() if k in fields and k not in derived}
        return spec(**same, **derived)


def read_option(r: OptionReader, opt: Opt) -> tuple[str, Any]:
    """``(spelling used, value)`` of one declared option from Spark's strings (default
    applied), for a connector that reads some options itself (the Kafka source)."""
    if opt.kind.prefix:
        return opt.spark, opt.kind.spark(r, opt.spark, opt) or opt.kind.absent(opt)
    # aliases count as valid names ("did you mean"), former names never do
    given = ([n for n in (opt.spark, *opt.aliases) if r.has(n)]
             + [n for n in opt.deprecated if r.present(n)])
    if len(given) > 1:
        raise OptionError(f"{r.family}: options {given} cannot be used together; set only "
                          f"'{opt.spark}'", option=given[0])
    name = given[0] if given else opt.spark
    if name in opt.deprecated:
        _deprecated(r.family, name, opt.spark)
    value = opt.kind.spark(r, name, opt)
    if value is None and opt.required:
        raise required_error(r.family, name, opt.hint)
    return name, opt.kind.absent(opt) if value is None else value


def spark_values(table: tuple[Opt, ...], options: Mapping[str, Any], family: str) -> Values:
    """Spark's string options -> :class:`Values`; an option the table does not declare is
    refused (:meth:`OptionReader.refuse_unknown`), before any cross-field check."""
    r = OptionReader(options, family=family)
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for opt in table:
        names[opt.arg], values[opt.arg] = read_option(r, opt)
    r.refuse_unknown(prefixes=tuple(o.spark for o in table if o.kind is PREFIXED))
    return Values(family, values, names)


def python_values(table: tuple[Opt, ...], arguments: Mapping[str, Any], family: str,
                  owner: str) -> Values:
    """The Python API's arguments -> :class:`Values`, checked like the Spark options."""
    unknown = [k for k in arguments if k not in valid_arguments(table)]
    if unknown:
        raise unknown_arguments(owner, unknown, valid_arguments(table))
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for opt in table:
        name, raw = opt.arg, arguments.get(opt.arg)
        for old in opt.deprecated_args:
            if arguments.get(old) is None:
                continue
            if raw is not None and raw != opt.default:
                raise option_error(family, old, f"cannot be used together with '{opt.arg}'",
                                   f"set only '{opt.arg}'")
            _deprecated(family, old, opt.arg)
            name, raw = old, arguments[old]
        value = None if raw is None else opt.kind.python(raw, name, opt, family)
        if value is None and opt.required:
            raise required_error(family, name, opt.hint)
        names[opt.arg], values[opt.arg] = name, opt.kind.absent(opt) if value is None else value
    return Values(family, values, names)


def _deprecated(family: str, old: str, new: str) -> None:
    # Point the warning at the user's line, past this package's frames.
    frame: FrameType | None = sys._getframe(0)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{family}: option '{old}' is deprecated and will be removed; use '{new}'",
                  DeprecationWarning, stacklevel=level)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

D = TypeVar("D", bound="Declared")


class Declared:
    """Base of a sink's parsed options: both entry points go through its table (``OPTIONS``)
    to the sink's one ``_build``."""

    OPTIONS: ClassVar[tuple[Opt, ...]]
    FAMILY: ClassVar[str]

    @classmethod
    def from_options(cls: type[D], options: Mapping[str, Any]) -> D:
        """From Spark's string options (``writeStream.format(...).option(...)``)."""
        return cls._build(spark_values(cls.OPTIONS, options, cls.FAMILY))

    @classmethod
    def create(cls: type[D], **arguments: Any) -> D:
        """From the Python API's arguments (the sink's constructor)."""
        return cls._build(python_values(cls.OPTIONS, arguments, cls.FAMILY,
                                        f"{cls.__name__}.create"))

    @classmethod
    def _build(cls: type[D], values: Values) -> D:
        """The cross-field checks and the spec, for both entry points."""
        raise NotImplementedError


def spark_names(table: tuple[Opt, ...]) -> frozenset[str]:
    """Every Spark spelling a table takes (prefixes as ``kafka.``), lower-cased as Spark
    hands them over."""
    return frozenset(n.lower() for o in table for n in (o.spark, *o.aliases, *o.deprecated))


# -- the Python constructor -------------------------------------------------------------------
def valid_arguments(table: tuple[Opt, ...]) -> list[str]:
    return [o.arg for o in table] + [d for o in table for d in o.deprecated_args]


def unknown_arguments(owner: str, unknown: list[str], valid: list[str]) -> UnknownArgumentError:
    hints = []
    for name in unknown:
        match = closest(name, valid)
        hints.append(f"{name!r}" + (f" (did you mean {match!r}?)" if match else ""))
    return UnknownArgumentError(
        f"{owner}() got an unknown keyword argument {', '.join(hints)}; valid arguments: "
        f"{valid}", option=unknown[0])


F = TypeVar("F", bound=Callable[..., None])


def checked_arguments(table: tuple[Opt, ...]) -> Callable[[F], F]:
    """Make an unknown keyword argument of a sink's ``__init__`` an
    :class:`UnknownArgumentError` naming the closest declared one (``FileSink(path,
    partiton_by=...)``: "did you mean 'partition_by'?"), not Python's bare ``TypeError``."""
    valid = valid_arguments(table)

    def decorate(init: F) -> F:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            unknown = [k for k in kwargs if k not in valid]
            if unknown:
                raise unknown_arguments(type(self).__name__, unknown, valid)
            init(self, *args, **kwargs)

        return cast(F, wrapper)

    return decorate


def given(frame_locals: Mapping[str, Any]) -> dict[str, Any]:
    """A constructor's arguments from its ``locals()`` (taken first thing), without ``self``."""
    return {k: v for k, v in frame_locals.items() if k not in ("self", "__class__")}


def signature_mismatches(init: Callable[..., Any], table: tuple[Opt, ...]) -> list[str]:
    """Where ``init``'s parameters or defaults differ from the table (order aside): every
    declared argument is a parameter with the declared default (a required one has none, or
    None), every former name is a parameter defaulting to None, and nothing else is."""
    params = {n: p for n, p in inspect.signature(init).parameters.items() if n != "self"}
    declared = {o.arg: o for o in table}
    former = {d for o in table for d in o.deprecated_args}
    problems = []
    for name, p in params.items():
        if name in former:
            if p.default is not None:
                problems.append(f"{name}: a former name must default to None")
        elif name not in declared:
            problems.append(f"{name}: a parameter the table does not declare")
        elif declared[name].required:
            if p.default not in (p.empty, None):
                problems.append(f"{name}: required, but defaults to {p.default!r}")
        elif p.default is p.empty or p.default != declared[name].default:
            problems.append(f"{name}: defaults to {p.default!r}, the table says "
                            f"{declared[name].default!r}")
    problems += [f"{n}: declared, not a parameter" for n in [*declared, *former]
                 if n not in params]
    return problems


# -- the docs table ---------------------------------------------------------------------------
#: Rows every sink's table ends with: options Spark's adapter and the reader handle.
_COMMON_ROWS = (
    ("`batchId`", "(the `write` argument)", "",
     "required for `df.write` (batch) writes: the batch's stable id"),
    ("`ignoreUnknownOptions`", "-", "`false`", "an option the sink does not know (a typo) is an "
     "error naming the closest valid one; `true` only warns"),
)


def _row(*cells: str) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def _bounds(o: Opt) -> str:
    unit = "s" if o.kind is DURATION else ""
    low = (f">= {o.minimum:g}{unit}" if o.minimum is not None
           else f"> {o.above:g}{unit}" if o.above is not None else "")
    high = f"<= {o.maximum:g}{unit}" if o.maximum is not None else ""
    return f"({', '.join(filter(None, (low, high)))})" if low or high else ""


def docs_table(table: tuple[Opt, ...], common: bool = True, python: bool = True) -> str:
    """The markdown options table of a sink's docs page, from its declaration
    (``common=False``: without the rows every sink's table ends with, for a source's;
    ``python=False``: without the Python argument column, for options Spark's alone take)."""
    rows = [_row("Spark option", *(["Python argument"] if python else []), "default", "meaning"),
            "|---|---|---|---|" if python else "|---|---|---|"]
    for o in table:
        spark = f"`{o.spark}*`" if o.kind.prefix else f"`{o.spark}`"
        spark += "".join(f" (or `{a}`)" for a in o.aliases)
        spark += "".join(f" (formerly `{d}`, deprecated)" for d in o.deprecated)
        arg = f"`{o.arg}`" + (f" {o.arg_note}" if o.arg_note else "")
        arg += "".join(f" (formerly `{d}`, deprecated)" for d in o.deprecated_args)
        if o.shown_default is not None:
            default = o.shown_default
        elif o.required:
            default = "required"
        elif o.default is None or o.default == ():
            default = ""
        else:
            default = o.kind.shown(o.default)
        rows.append(_row(spark, *([arg] if python else []),
                         " ".join(filter(None, (default, _bounds(o)))), o.help))
    return "\n".join([*rows, *(_row(*r) for r in (_COMMON_ROWS if common else ()))]) + "\n"
