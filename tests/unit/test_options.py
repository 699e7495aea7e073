"""Option parsing: every error names the option (in the user's spelling) and what is valid,
and secrets never appear in errors, repr or logs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from connectors.core.errors import OptionError
from connectors.core.options import (
    OptionReader,
    RedactedDict,
    Secret,
    parse_duration,
    redact_url,
    stringify_options,
)


def reader(**opts):
    # Spark lower-cases option keys; the reader must not care.
    return OptionReader({k.lower(): v for k, v in opts.items()}, family="eo_test")


def test_required_names_the_option():
    with pytest.raises(OptionError, match="'sink_id' is required") as e:
        reader().required("sink_id", hint="a stable name for this sink")
    assert e.value.option == "sink_id"
    assert "eo_test" in str(e.value)
    assert reader(sink_id=" a ").required("sink_id") == "a"
    with pytest.raises(OptionError, match="sink_id"):
        reader(sink_id="  ").required("sink_id")


def test_integer_bounds_and_type():
    r = reader(maxOffsetsPerTrigger="1000", minPartitions="0", batchSize="ten")
    assert r.integer("maxOffsetsPerTrigger", minimum=1) == 1000
    with pytest.raises(OptionError, match=r"'minPartitions' is out of range.*>= 1"):
        r.integer("minPartitions", minimum=1)
    with pytest.raises(OptionError, match=r"'batchSize' must be an integer, got 'ten'"):
        r.integer("batchSize")
    assert r.integer("absent", 7) == 7
    with pytest.raises(OptionError, match=r"valid range is 1\.\.10"):
        reader(n="11").integer("n", minimum=1, maximum=10)


def test_boolean():
    assert reader(failOnDataLoss="FALSE").boolean("failOnDataLoss", True) is False
    assert reader(x="yes").boolean("x", False) is True
    assert reader().boolean("x", True) is True
    with pytest.raises(OptionError, match="'failOnDataLoss' must be a boolean.*'true' or 'false'"):
        reader(failOnDataLoss="maybe").boolean("failOnDataLoss", True)


def test_duration_units_and_bounds():
    assert parse_duration("500ms") == 0.5
    assert parse_duration("10 seconds") == 10
    assert parse_duration("2m") == 120
    assert parse_duration("1h") == 3600
    assert parse_duration("3") == 3
    assert reader(maxTriggerDelay="15m").duration("maxTriggerDelay") == 900
    with pytest.raises(OptionError, match="'maxTriggerDelay' is not a duration.*'500ms'"):
        reader(maxTriggerDelay="soon").duration("maxTriggerDelay")
    with pytest.raises(OptionError, match="'retryDeadline' is out of range"):
        reader(retryDeadline="2h").duration("retryDeadline", maximum=3600)
    with pytest.raises(OptionError, match="not a duration"):
        reader(d="5 fortnights").duration("d")


def test_json_and_expect():
    assert reader(startingOffsets='{"t": {"0": -2}}').json("startingOffsets") == {"t": {"0": -2}}
    with pytest.raises(OptionError, match="'startingOffsets' is not valid JSON"):
        reader(startingOffsets="{t:").json("startingOffsets")
    with pytest.raises(OptionError, match="'clusters' must be a JSON list, got dict"):
        reader(clusters="{}").json("clusters", expect=list)


def test_choice_is_case_insensitive_and_lists_valid_values():
    assert reader(mode="UPSERT").choice("mode", ["append", "upsert"]) == "upsert"
    valid = r"'mode' has invalid value 'merge'.*\['append', 'upsert'\]"
    with pytest.raises(OptionError, match=valid):
        reader(mode="merge").choice("mode", ["append", "upsert"])


def test_exclusive_groups():
    group = ("subscribe", "subscribePattern", "assign")
    assert reader(subscribe="a").exclusive(*group) == "subscribe"
    with pytest.raises(OptionError, match="cannot be used together") as e:
        reader(subscribe="a", assign="{}").exclusive("subscribe", "subscribePattern", "assign")
    assert e.value.option == "subscribe"
    with pytest.raises(OptionError, match="one of the options .* is required"):
        reader().exclusive("subscribe", "subscribePattern", "assign", required=True)
    assert reader().exclusive("a", "b") is None


def test_unknown_options_are_an_error_naming_the_closest_valid_one():
    r = reader(subscribe="t", startingOffset="earliest", checkpointLocation="/c",
               **{"kafka.acks": "all"})
    r.string("subscribe")
    r.string("startingOffsets")
    r.prefixed("kafka.")
    with pytest.raises(OptionError) as e:
        r.refuse_unknown()
    assert "unknown option 'startingoffset' (did you mean 'startingOffsets'?)" in str(e.value)
    assert e.value.option == "startingoffset" and "ignoreUnknownOptions=true" in str(e.value)


def test_unknown_options_warn_once_with_ignore_unknown_options(caplog):
    r = reader(subscribe="t", startingOffset="earliest", ignoreUnknownOptions="true",
               **{"kafka.acks": "all"})
    r.string("subscribe")
    r.prefixed("kafka.")
    with caplog.at_level(logging.WARNING):
        assert r.refuse_unknown() == ["startingoffset"]
    assert "startingoffset" in caplog.text


def test_secrets_are_redacted_everywhere(caplog):
    r = reader(**{"kafka.sasl.password": "hunter2", "kafka.acks": "1", "password": "pw1"})
    conf = r.prefixed("kafka.")
    assert isinstance(conf, RedactedDict)
    assert conf["sasl.password"] == "hunter2"  # the real value still reaches librdkafka
    assert "hunter2" not in repr(conf) and "hunter2" not in str(conf)
    assert "hunter2" not in str(r.redacted()) and "pw1" not in str(r.redacted())
    # an error about a secret option never echoes its value
    with pytest.raises(OptionError) as e:
        reader(password="s3cr3t!").integer("password")
    assert "s3cr3t!" not in str(e.value)
    with pytest.raises(OptionError) as e:
        reader(password="s3cr3t!").choice("password", ["a"])
    assert "s3cr3t!" not in str(e.value)
    s = reader(password="pw").secret("password")
    assert isinstance(s, Secret) and s.get() == "pw" and "pw" not in repr(s)

    @dataclass(frozen=True)
    class Spec:
        url: str
        password: Secret | None = field(default=None)

    assert "pw" not in repr(Spec("u", s))


def test_redact_url():
    assert redact_url("postgresql+psycopg://bob:pa55@db:5432/x") == (
        "postgresql+psycopg://bob:***@db:5432/x"
    )
    assert redact_url("mysql://h/db?password=zz&x=1") == "mysql://h/db?password=***&x=1"
    assert redact_url("sqlite:///tmp/a.db") == "sqlite:///tmp/a.db"


def test_stringify_options():
    assert stringify_options({"a": True, "b": 3, "c": None, "d": {"x": 1}}) == {
        "a": "true", "b": "3", "d": '{"x": 1}'
    }
