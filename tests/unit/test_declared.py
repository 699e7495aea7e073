"""The option declaration (connectors/core/declared.py) on a small table of its own: both
entry points give the same values, with the same checks, errors in each caller's spelling."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest

from connectors.core.declared import (
    BOOLEAN,
    CHOICE,
    CSV_LIST,
    DURATION,
    INTEGER,
    PREFIXED,
    STRING,
    Opt,
    checked_arguments,
    docs_table,
    given,
    python_values,
    signature_mismatches,
    sink_id_option,
    spark_names,
    spark_values,
)
from connectors.core.errors import OptionError, UnknownArgumentError

TABLE = (
    Opt("fullName", "full_name", STRING, required=True, hint="who", help="the name"),
    sink_id_option(False, "the id"),
    Opt("count", "count", INTEGER, 3, minimum=1, maximum=10, help="how many"),
    Opt("wait", "wait", DURATION, 30.0, above=0, deprecated=("oldWait",),
        deprecated_args=("old_wait",), help="how long"),
    Opt("on", "on", BOOLEAN, False, help="whether"),
    Opt("mode", "mode", CHOICE, "fast", choices=("fast", "slow"), help="which"),
    Opt("cols", "cols", CSV_LIST, (), shown_default="none", help="columns"),
    Opt("x.", "x_options", PREFIXED, arg_note="(keys without `x.`)", help="passed on"),
)


def spark(**options: Any) -> dict[str, Any]:
    # Spark lower-cases the keys it hands over
    return dict(spark_values(TABLE, {k.lower(): v for k, v in options.items()}, "eo_t"))


def python(**arguments: Any) -> dict[str, Any]:
    return dict(python_values(TABLE, arguments, "eo_t", "T"))


def test_both_entry_points_give_the_same_values() -> None:
    a = spark(fullName=" n ", sinkId="s-1", count="5", wait="500ms", on="true", mode="SLOW",
              cols="a, b,", **{"x.k": "v"})
    b = python(full_name="n", sink_id="s-1", count=5, wait=0.5, on=True, mode="slow",
               cols=["a", "b"], x_options={"k": "v"})
    assert a == b == {"full_name": "n", "sink_id": "s-1", "count": 5, "wait": 0.5, "on": True,
                      "mode": "slow", "cols": ("a", "b"), "x_options": {"k": "v"}}
    defaults = {"sink_id": None, "count": 3, "wait": 30.0, "on": False, "mode": "fast",
                "cols": (), "x_options": None}
    assert spark(fullName="n") == python(full_name="n") == {"full_name": "n", **defaults}


def test_a_python_string_is_read_as_the_spark_option() -> None:
    assert python(full_name="n", count="7", wait="2m", on="false", cols="a,b") == python(
        full_name="n", count=7, wait=120, on=False, cols=("a", "b"))


@pytest.mark.parametrize(
    ("spark_options", "python_arguments", "fragment"),
    [
        ({}, {}, "is required but was not set; set it (who)"),
        ({"count": "0"}, {"count": 0}, r"is out of range (0); valid range is 1..10"),
        ({"count": "11"}, {"count": "11"}, r"is out of range (11); valid range is 1..10"),
        ({"wait": "0s"}, {"wait": 0}, "it must be > 0"),
        ({"mode": "medium"}, {"mode": "medium"}, "valid values: ['fast', 'slow']"),
        ({"on": "maybe"}, {"on": "maybe"}, "must be a boolean"),
        ({"sink_id": "a/b"}, {"sink_id": "a/b"}, "1-128 characters"),
    ],
)
def test_the_same_checks_name_each_side_s_spelling(spark_options: dict[str, str],
                                                   python_arguments: dict[str, Any],
                                                   fragment: str) -> None:
    base_spark = {} if not spark_options else {"fullName": "n"}
    base_python = {} if not python_arguments else {"full_name": "n"}
    with pytest.raises(OptionError) as s:
        spark(**base_spark, **spark_options)
    with pytest.raises(OptionError) as p:
        python(**base_python, **python_arguments)
    assert fragment in str(s.value) and fragment in str(p.value)
    name = next(iter(spark_options), "fullName")
    arg = next(iter(python_arguments), "full_name")
    assert s.value.option == name and f"option '{name}'" in str(s.value)
    assert p.value.option == arg and f"option '{arg}'" in str(p.value)


@pytest.mark.parametrize(
    ("argument", "value", "fragment"),
    [("count", 1.5, "must be an integer, got 1.5"), ("count", True, "must be an integer"),
     ("on", 2, "must be a boolean"), ("wait", True, "must be a number of seconds"),
     ("wait", float("nan"), "must be a number of seconds"), ("cols", 5, "must be a list"),
     ("full_name", 5, "must be a string"), ("x_options", "k=v", "must be a mapping")],
)
def test_python_values_of_the_wrong_type(argument: str, value: Any, fragment: str) -> None:
    with pytest.raises(OptionError, match=f"option '{argument}' {fragment}"):
        python(**{"full_name": "n", argument: value})


def test_unknown_options_and_arguments_name_the_closest_declared_one() -> None:
    with pytest.raises(OptionError, match="unknown option 'cont' \\(did you mean 'count'\\?\\)"):
        spark(fullName="n", cont="1")
    assert spark(fullName="n", cont="1", ignoreUnknownOptions="true")["count"] == 3
    spark(fullName="n", checkpointLocation="/c", batchId="3", **{"x.any.key": "1"})
    with pytest.raises(UnknownArgumentError, match="'ful_name' \\(did you mean 'full_name'\\?"):
        python(ful_name="n")


def test_sink_id_takes_sink_id_or_sinkId_but_not_both() -> None:
    assert spark(fullName="n", sink_id="a")["sink_id"] == spark(fullName="n", sinkId="a")[
        "sink_id"] == "a"
    with pytest.raises(OptionError, match=r"\['sink_id', 'sinkId'\] cannot be used together"):
        spark(fullName="n", sink_id="a", sinkId="a")


def test_former_names_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match="'oldWait' is deprecated.*use 'wait'") as w:
        assert spark(fullName="n", oldWait="5s")["wait"] == 5.0
    assert w[0].filename == __file__  # the warning points at the caller, not at connectors/
    with pytest.warns(DeprecationWarning, match="'old_wait' is deprecated.*use 'wait'"):
        assert python(full_name="n", old_wait=5)["wait"] == 5.0
    with pytest.raises(OptionError, match="cannot be used together"):
        spark(fullName="n", oldWait="5s", wait="5s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(OptionError, match="'old_wait' cannot be used together with 'wait'"):
            python(full_name="n", old_wait=5, wait=6)
    # "did you mean" never suggests a former name
    with pytest.raises(OptionError) as e:
        spark(fullName="n", oldwai="5s")
    assert "oldWait" not in str(e.value)


def test_values_name_options_as_given_and_build_loses_none() -> None:
    v = spark_values(TABLE, {"fullname": "n", "sinkid": "s"}, "eo_t")
    assert (v.name("full_name"), v.name("sink_id"), v.name("count")) == ("fullName", "sinkId",
                                                                         "count")
    assert str(v.error("count", "is odd", "give an even one")) == (
        "eo_t: option 'count' is odd; give an even one")

    @dataclass(frozen=True)
    class Spec:
        full_name: str
        sink_id: str | None
        count: int
        wait: float
        on: bool
        mode: str
        cols: tuple[str, ...]

    spec = v.build(Spec, used=("x_options",), count=4)
    assert (spec.full_name, spec.sink_id, spec.count, spec.cols) == ("n", "s", 4, ())
    with pytest.raises(TypeError, match=r"\['x_options'\] reach no field"):
        v.build(Spec)


class Thing:
    @checked_arguments(TABLE)
    def __init__(self, full_name: str, *, sink_id: str | None = None, count: int = 3,
                 wait: float = 30.0, on: bool = False, mode: str = "fast",
                 cols: tuple[str, ...] = (), x_options: dict[str, str] | None = None,
                 old_wait: float | None = None) -> None:
        self.values = python_values(TABLE, given(locals()), "eo_t", "Thing")


def test_constructor_checks_and_its_signature_against_the_table() -> None:
    assert Thing("n", count=4).values["count"] == 4
    with pytest.raises(UnknownArgumentError, match="Thing\\(\\) got an unknown keyword "
                       "argument 'coutn' \\(did you mean 'count'\\?\\)"):
        Thing("n", coutn=4)
    assert signature_mismatches(Thing.__init__, TABLE) == []

    def drifted(self: Any, full_name: str = "x", *, count: int = 4, extra: int = 0,
                old_wait: float = 1.0) -> None:
        """Defaults a required option, changes one, adds one, drops the rest."""

    problems = signature_mismatches(drifted, TABLE)
    assert "full_name: required, but defaults to 'x'" in problems
    assert "count: defaults to 4, the table says 3" in problems
    assert "extra: a parameter the table does not declare" in problems
    assert "old_wait: a former name must default to None" in problems
    assert "wait: declared, not a parameter" in problems


def test_docs_table() -> None:
    assert docs_table(TABLE[:5]) == "\n".join([
        "| Spark option | Python argument | default | meaning |",
        "|---|---|---|---|",
        "| `fullName` | `full_name` | required | the name |",
        "| `sink_id` (or `sinkId`) | `sink_id` | none | the id |",
        "| `count` | `count` | `3` (>= 1, <= 10) | how many |",
        "| `wait` (formerly `oldWait`, deprecated) | `wait` (formerly `old_wait`, deprecated) "
        "| `30s` (> 0s) | how long |",
        "| `on` | `on` | `false` | whether |",
        "| `batchId` | (the `write` argument) | | required for `df.write` (batch) writes: the "
        "batch's stable id |",
        "| `ignoreUnknownOptions` | - | `false` | an option the sink does not know (a typo) is "
        "an error naming the closest valid one; `true` only warns |",
    ]) + "\n"
    assert "| `x.*` | `x_options` (keys without `x.`) | | passed on |" in docs_table(TABLE)
    assert "| `cols` | `cols` | none | columns |" in docs_table(TABLE)


def test_spark_names() -> None:
    assert spark_names(TABLE) == {"fullname", "sink_id", "sinkid", "count", "wait", "oldwait",
                                  "on", "mode", "cols", "x."}
