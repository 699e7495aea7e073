"""Avro unions of several non-null types, as Spark's ``from_avro`` types them: a struct with
one field per non-null branch, ``member0``, ``member1``... in the union's order, of which
the decoded record's branch is set and the others are null (null, too, when the value is
the union's null).

fastavro decodes a union to the branch's plain value, so the branch is told from the
value's Python type after decoding (records by name: the decoder asks fastavro to return
``(name, record)`` for records in unions). That is exact only when no two branches decode
to the same Python type, so such a union (``int`` and ``long``, ``float`` and ``double``,
``string`` and an enum, ``bytes`` and a ``fixed``, an array and... another array, a map and
another map) is refused when the query starts, naming the field; Spark's JVM reader, which
sees the branch index, types those too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa

#: Python type of a decoded value -> its kind (bool before int: a bool is an int).
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "floating"), (Decimal, "decimal"),
    (bytes, "bytes"), (str, "text"), (list, "array"), (dict, "map"))


def branch_kind(schema: Any, names: Mapping[str, Any], namespace: str | None = None) -> str:
    """What a union branch decodes to: one of :data:`_KINDS`' kinds, or ``record:<name>``."""
    if isinstance(schema, str):
        simple = {"boolean": "boolean", "int": "integer", "long": "integer",
                  "float": "floating", "double": "floating", "bytes": "bytes",
                  "string": "text"}.get(schema)
        if simple is not None:
            return simple
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        named = names.get(full, names.get(schema))
        return "record:?" if named is None else branch_kind(named, names, namespace)
    if not isinstance(schema, Mapping):
        return "?"
    kind, logical = schema.get("type"), schema.get("logicalType")
    if kind in ("record", "error"):
        return f"record:{full_name(schema, namespace)}"
    if kind == "enum":
        return "text"
    if kind == "fixed" or kind == "bytes":
        return "decimal" if logical == "decimal" else "bytes"
    if kind == "array":
        return "array"
    if kind == "map":
        return "map"
    return branch_kind(kind, names, namespace)


def full_name(schema: Mapping[str, Any], namespace: str | None) -> str:
    name = str(schema.get("name", ""))
    ns = schema.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def check_distinct(branches: list[Any], names: Mapping[str, Any], namespace: str | None,
                   path: str) -> list[str]:
    """The branches' kinds; a :class:`ValueError` naming the pair no decoded value tells
    apart."""
    kinds = [branch_kind(b, names, namespace) for b in branches]
    for i, kind in enumerate(kinds):
        if kind in kinds[:i]:
            j = kinds.index(kind)
            raise ValueError(
                f"eo_kafka: {path} is a union whose branches {branches[j]!r} and "
                f"{branches[i]!r} decode to the same kind of value, so the branch of a "
                "record cannot be told here; Spark's own from_avro reads it")
    return kinds


def union_type(members: list[pa.DataType]) -> pa.DataType:
    """Spark's type of a union of several non-null types."""
    return pa.struct([pa.field(f"member{i}", t) for i, t in enumerate(members)])


def has_union(schema: Any, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a parsed Avro schema holds a union of several non-null types anywhere."""
    if isinstance(schema, list):
        if sum(1 for b in schema if b != "null") > 1:
            return True
        return any(has_union(b, seen) for b in schema)
    if isinstance(schema, Mapping):
        kind = schema.get("type")
        if kind in ("record", "error"):
            name = str(schema.get("name"))
            if name in seen:
                return False
            return any(has_union(f.get("type"), seen | {name})
                       for f in schema.get("fields", []))
        if kind == "array":
            return has_union(schema.get("items"), seen)
        if kind == "map":
            return has_union(schema.get("values"), seen)
        return has_union(kind, seen) if isinstance(kind, (list, dict)) else False
    return False


def tagger(schema: Any) -> Callable[[Any], Any]:
    """fastavro's decoded value of ``schema`` (read with ``return_record_name=True``) ->
    the value of its Arrow type: records in unions unwrapped, multi-type unions as member
    structs."""
    names: dict[str, Any] = {}

    def build(s: Any, ns: str | None) -> Callable[[Any], Any]:
        if isinstance(s, list):
            branches = [b for b in s if b != "null"]
            if len(branches) == 1:
                inner = build(branches[0], ns)
                return lambda v: inner(v[1] if isinstance(v, tuple) else v)
            convs = [build(b, ns) for b in branches]
            kinds = [branch_kind(b, names, ns) for b in branches]
            fields = [f"member{i}" for i in range(len(branches))]

            def union(v: Any) -> Any:
                if v is None:
                    return None
                if isinstance(v, tuple):
                    kind, v = f"record:{v[0]}", v[1]
                    i = next((k for k, name in enumerate(kinds) if name == kind
                              or name.endswith("." + kind[7:]) or kind.endswith("." + name[7:])),
                             -1)
                else:
                    kind = next(k for t, k in _KINDS if isinstance(v, t))
                    i = kinds.index(kind) if kind in kinds else -1
                if i < 0:
                    raise ValueError(f"a union value of kind {kind} matches no branch of "
                                     f"{branches!r}")
                return {f: (convs[i](v) if k == i else None) for k, f in enumerate(fields)}
            return union
        if isinstance(s, str):
            full = s if "." in s or not ns else f"{ns}.{s}"
            named = names.get(full, names.get(s))
            if named is None:
                return lambda v: v
            return lambda v: build_named(named, ns)(v)
        if not isinstance(s, Mapping):
            return lambda v: v
        kind = s.get("type")
        if kind in ("record", "error"):
            full = full_name(s, ns)
            names[full] = s
            inner_ns = full.rsplit(".", 1)[0] if "." in full else ns
            by_field = [(f["name"], build(f["type"], inner_ns)) for f in s.get("fields", [])]
            return lambda v: None if v is None else {n: c(v.get(n)) for n, c in by_field}
        if kind in ("enum", "fixed"):
            names[full_name(s, ns)] = s
            return lambda v: v
        if kind == "array":
            item = build(s.get("items"), ns)
            return lambda v: None if v is None else [item(x) for x in v]
        if kind == "map":
            value = build(s.get("values"), ns)
            return lambda v: None if v is None else {k: value(x) for k, x in v.items()}
        if isinstance(kind, (list, dict)):
            return build(kind, ns)
        return lambda v: v

    cache: dict[int, Callable[[Any], Any]] = {}

    def build_named(s: Any, ns: str | None) -> Callable[[Any], Any]:
        conv = cache.get(id(s))
        if conv is None:
            conv = cache[id(s)] = build(s, ns)
        return conv

    return build(schema, None)
