"""The kinds of the ``eo_kafka`` source's options whose value has a structure: a topic
list, a pattern, partitions, a start or an end (:class:`~connectors.core.option_kinds.Kind`,
beside the plain kinds of :mod:`connectors.core.option_kinds`).

Each reads Spark's string through :meth:`Structured.parse`, which a field of the same name
in a ``clusters`` entry goes through as well, under a name that says which entry
(``subscribe (clusters entry 'east')``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from connectors.core.option_kinds import Kind, OptionSpec
from connectors.core.options import OptionReader, option_error
from connectors.kafka.source.offsets import parse_assign, parse_partition_offsets
from connectors.kafka.source.specs import StartSpec


class Structured(Kind):
    """An option read by :meth:`parse` from its text; None when it is not set."""

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        text = r.string(name)
        return None if text is None else self.parse(text, name, r.family)

    def parse(self, text: str, name: str, family: str) -> Any:
        raise NotImplementedError


class _Topics(Structured):
    what = "a comma-separated list of topics"

    def parse(self, text: str, name: str, family: str) -> tuple[str, ...]:
        topics = tuple(t.strip() for t in text.split(",") if t.strip())
        if not topics:
            raise option_error(family, name, "names no topic", "give 'topicA,topicB'")
        return topics


class _Pattern(Structured):
    what = "a regular expression"

    def parse(self, text: str, name: str, family: str) -> str:
        try:
            re.compile(text)
        except re.error as e:
            raise option_error(family, name, f"is not a valid regular expression ({e})",
                               "give a Java/Python regex such as 'events-.*'") from None
        return text


class _Partitions(Structured):
    what = 'a JSON object such as {"topicA": [0, 1]}'

    def parse(self, text: str, name: str, family: str) -> tuple[tuple[str, int], ...]:
        return parse_assign(text, name, family)


class _Start(Structured):
    """``startingOffsets``: ``earliest``, ``latest``, ``group`` or per-partition JSON."""

    def parse(self, text: str, name: str, family: str) -> StartSpec:
        lowered = text.strip().lower()
        if lowered in ("earliest", "latest", "group"):
            return StartSpec(lowered)
        if not text.strip().startswith("{"):
            raise option_error(
                family, name, f"has invalid value {text!r}",
                "use 'earliest', 'latest', 'group' or per-partition JSON "
                '{"topic": {"0": 23, "1": -2}} (-2 = earliest, -1 = latest)')
        return StartSpec("offsets", triples(parse_partition_offsets(text, name, family=family)))


class _StartByTimestamp(Structured):
    """``startingOffsetsByTimestamp``: per-partition epoch milliseconds."""

    def parse(self, text: str, name: str, family: str) -> StartSpec:
        parsed = parse_partition_offsets(text, name, family=family, timestamps=True)
        return StartSpec("timestamps", triples(parsed))


class _StartTimestamp(Structured):
    """``startingTimestamp``: one epoch-ms timestamp for every partition."""

    what = "epoch milliseconds"

    def parse(self, text: str, name: str, family: str) -> StartSpec:
        try:
            ts = int(text)
        except ValueError:
            raise option_error(family, name, f"must be epoch milliseconds, got {text!r}",
                               "give an integer such as 1700000000000") from None
        if ts < 0:
            raise option_error(family, name, "is negative", "give epoch milliseconds >= 0")
        return StartSpec("timestamp", timestamp=ts)


class _End(Structured):
    """``endingOffsets``: ``latest`` or per-partition JSON (no ``earliest``, no -2)."""

    def parse(self, text: str, name: str, family: str) -> StartSpec:
        if text.lower() == "latest":
            return StartSpec("latest")
        if text.lower() == "earliest":
            raise option_error(family, name, "cannot be 'earliest'", "use 'latest' or JSON")
        parsed = parse_partition_offsets(text, name, family=family, allow_earliest=False)
        return StartSpec("offsets", triples(parsed))


class _JsonList(Kind):
    """``clusters``: a JSON list (its entries are read by the source's parser)."""

    what = "a JSON list"

    def spark(self, r: OptionReader, name: str, opt: OptionSpec) -> Any:
        return r.json(name, expect=list)


def triples(parsed: Mapping[tuple[str, int], int]) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted((t, p, o) for (t, p), o in parsed.items()))


TOPICS = _Topics()
PATTERN = _Pattern()
PARTITIONS = _Partitions()
START = _Start()
START_BY_TIMESTAMP = _StartByTimestamp()
START_TIMESTAMP = _StartTimestamp()
END = _End()
JSON_LIST = _JsonList()
