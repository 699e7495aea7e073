"""The CLI's Kafka commands (``eo-connectors lag``, ``transactions``) and the librdkafka
settings every Kafka command takes (``--kafka``, ``--kafka-config``). Each command returns its
JSON document and its text lines; ``connectors.cli`` prints them. Nothing here creates a
topic: lookups by name go through ``kafka/lookup`` (see its docstring)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from connectors.core.errors import ConnectorError


# -- lag ---------------------------------------------------------------------------------------
def kafka_settings(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka settings from ``--kafka-config FILE`` then ``--kafka KEY=VALUE``."""
    lines: list[str] = []
    if getattr(args, "kafka_config", None):
        try:
            with open(args.kafka_config, encoding="utf-8") as f:
                lines += f.read().splitlines()
        except OSError as e:
            raise ConnectorError(f"--kafka-config {args.kafka_config!r}: {e.strerror}") from None
    lines += getattr(args, "kafka", None) or []
    out: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConnectorError(f"Kafka setting {key!r}: give KEY=VALUE, e.g. "
                                 "security.protocol=SASL_SSL")
        out[key.strip().removeprefix("kafka.")] = value.strip()
    return out


def source_group(group: str) -> bool:
    """``group`` is named as an ``eo_kafka`` source names its own group (without
    ``kafka.group.id`` nor ``groupIdPrefix``: ``eo-kafka-source-<12 hex digits>``), so it is
    known to be one. Any other name may be anyone's: ``lag`` says nothing of eo_kafka's
    commit timing for it."""
    from connectors.kafka.source.declaration import DEFAULT_GROUP_PREFIX

    return re.fullmatch(re.escape(DEFAULT_GROUP_PREFIX) + r"-[0-9a-f]{12}", group) is not None


#: How long lag waits for a stable answer (``lookup.stable_committed``) where the plain one
#: had no offset: long enough for a coordinator's new leader to catch up, short enough not to
#: hang on a transaction that holds one of the group's offsets.
STABLE_WAIT = 5.0


def lag(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Committed offsets of ``--group`` against the partitions' ends, read without changing
    anything (``kafka/lookup``: no admin ListConsumerGroupOffsets, no topic created; the ends
    from the process's cluster object, ``kafka/clients``: one ListOffsets per leader, all at
    once)."""
    from connectors.kafka import access, clients, lookup
    from connectors.kafka.common import LIBRDKAFKA_LOG

    conf: dict[str, Any] = {**kafka_settings(args), "bootstrap.servers": args.bootstrap,
                            "logger": LIBRDKAFKA_LOG}

    def named(call: Any, resource: str, request: str, topic: str = "") -> Any:
        try:
            return call()
        except (lookup.LookupFailed, ConnectorError) as e:
            if isinstance(e, lookup.TopicNotFound):
                raise
            needs = [a.bind(group=args.group, topic=topic) for a in access.ROLES["lag"]
                     if a.resource == resource]
            cause = e.cause if isinstance(e, lookup.LookupFailed) else e
            denied = access.denied(cause, who="lag", conf=conf, needs=needs, request=request)
            if denied is not None:
                raise ConnectorError(denied) from None
            raise ConnectorError(
                f"lag of group {args.group!r}: {e} (from {args.bootstrap}, within --timeout "
                f"{args.timeout:g}s). Is the broker reachable from here (host, port, TLS/SASL "
                "settings)?") from None

    looker = lookup.consumer(conf)
    # read_uncommitted: the offsets as committed, as Kafka's own tools show them, without
    # waiting on a transaction that holds an offset of the group (require_stable)
    group = lookup.consumer(conf, args.group, isolation="read_uncommitted")
    try:
        if args.topic:
            # The broker leaves topics the principal may not DESCRIBE out of a listing
            # without an error; naming the topic makes that denial visible.
            topics = {args.topic: named(
                lambda: lookup.topic_partitions(looker, args.topic, args.timeout,
                                                args.bootstrap, "lag"),
                "TOPIC", f"Metadata of topic {args.topic!r}", args.topic)}
        else:
            topics = named(lambda: lookup.all_topics(looker, args.timeout), "TOPIC",
                           "Metadata of all topics")
        tps = [(t, p) for t, parts in sorted(topics.items()) for p in parts]
        offsets: dict[tuple[str, int], int] = named(
            lambda: lookup.committed(group, tps, args.timeout), "GROUP",
            f"OffsetFetch of group {args.group!r}")
        # The plain answer may be older than the group's commits (stable_committed): ask
        # again stably for the partitions of the topics the group has offsets on (its
        # commits cover them together), or of every topic when it had none; not for every
        # topic the group never read, which would pay the stable wait on nearly every call.
        consumed = {t for t, _ in offsets}
        missing = [tp for tp in tps
                   if tp not in offsets and (not consumed or tp[0] in consumed)]
        if missing:
            offsets.update(named(
                lambda: lookup.stable_committed(conf, args.group, missing,
                                                min(args.timeout, STABLE_WAIT)),
                "GROUP", f"OffsetFetch of group {args.group!r}"))
        if not offsets:
            raise _no_offsets(args, len(topics))
        first = next(iter(offsets))[0]

        def ends_now() -> dict[tuple[str, int], int]:
            with clients.lease(conf) as kafka:
                return kafka.list_offsets(
                    dict.fromkeys(sorted(offsets), -1), committed=False, who="lag",
                    error=ConnectorError, timeout=args.timeout,
                    what=f"lag: ListOffsets of {len(offsets)} partition(s)")

        ends = named(ends_now, "TOPIC", "ListOffsets of the group's partitions", first)
    finally:
        group.close()
        looker.close()
    pending = pending_windows(args.wal_path, args) if getattr(args, "wal_path", None) else None
    return _lag_report(args.group, args.bootstrap, offsets, ends, pending)


def _no_offsets(args: argparse.Namespace, topics: int) -> ConnectorError:
    where = (f"topic {args.topic!r}" if args.topic else
             f"any of the {topics} topics this principal may describe")
    return ConnectorError(
        f"lag: group {args.group!r} has no committed offsets on {where} at "
        f"{args.bootstrap}: a group that never committed (an eo_kafka source "
        "commits after its first batch), a mistyped --group, or offsets expired "
        "after the broker's offsets.retention.minutes")


def pending_windows(wal_path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The windows of an ``eo_kafka`` source's WAL (``<walPath>/source``) that have no commit
    marker yet, as ``{"window", "start", "end"}`` with offsets per ``(topic, partition)``:
    planned, and not yet committed to the group (the source commits a window's end when
    Spark plans the batch after it). Read-only."""
    from connectors.core.wal import WriteAheadLog
    from connectors.kafka.source.window_log import WAL_KIND
    from connectors.state_report import open_storage

    storage, root = open_storage(wal_path, getattr(args, "storage", None))
    wal = WriteAheadLog(storage, root, WAL_KIND)
    if not storage.is_dir(wal.dir):
        raise ConnectorError(f"lag --wal-path {wal_path!r}: no eo_kafka source WAL there "
                             f"(no {WAL_KIND}/ directory); give the source's walPath option")
    seqs, committed = wal.listing()
    done = set(committed)
    out = []
    for seq in seqs:
        if seq in done:
            continue
        record = wal.get(seq) or {}
        out.append({"window": seq, "start": _flat(record.get("start")),
                    "end": _flat(record.get("end"))})
    return out


def _flat(offsets: Any) -> dict[tuple[str, int], int]:
    """Spark's offset JSON of one cluster (``{"topic": {"0": 42}}``) by (topic, partition);
    a multi-cluster WAL (one level deeper) gives nothing here."""
    flat: dict[tuple[str, int], int] = {}
    for topic, parts in (offsets or {}).items():
        if isinstance(parts, dict):
            for p, off in parts.items():
                if isinstance(off, int) and str(p).isdigit():
                    flat[(str(topic), int(p))] = off
    return flat


def _lag_report(group: str, bootstrap: str, offsets: dict[tuple[str, int], int],
                ends: dict[tuple[str, int], int],
                pending: list[dict[str, Any]] | None = None
                ) -> tuple[dict[str, Any], list[str]]:
    """``lag``'s document and lines: each partition's committed offset, end and lag; with
    ``pending`` (``--wal-path``), how much of the lag lies in windows the source planned
    and has not committed to the group yet."""
    partitions: list[dict[str, Any]] = []
    for (topic, partition), offset in sorted(offsets.items()):
        end = ends.get((topic, partition))
        partitions.append({
            "topic": topic, "partition": partition, "committed": offset,
            "end": end, "lag": None if end is None else max(0, end - offset),
        })
    total = sum(p["lag"] or 0 for p in partitions)
    lines = [f"group {group} @ {bootstrap}: total lag {total}"]
    lines += [f"  {p['topic']}[{p['partition']}] committed {p['committed']} end {p['end']} "
              f"lag {p['lag']}" for p in partitions]
    doc: dict[str, Any] = {"group": group, "total_lag": total, "partitions": partitions}
    if pending is not None:
        in_windows = _lag_in_windows(offsets, ends, pending)
        doc["pending_windows"] = [{"window": w["window"], "lag": n} for w, n in in_windows]
        lines += _pending_lines(total, in_windows)
    elif total and source_group(group):
        lines.append("  (an eo_kafka source commits a window's end when Spark plans the next "
                     "batch: after a finished AvailableNow/Once run, the last window shows as "
                     "lag until the next run; see docs/kafka-source.md)")
    return doc, lines


def _lag_in_windows(offsets: dict[tuple[str, int], int], ends: dict[tuple[str, int], int],
                    pending: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each pending window with the part of the group's lag inside it: per partition, the
    offsets from the group's committed one to the partition's end that the window spans."""
    out = []
    for w in pending:
        n = 0
        for tp, committed in offsets.items():
            end, w_start, w_end = ends.get(tp), w["start"].get(tp), w["end"].get(tp)
            if end is None or w_end is None:
                continue
            lo = max(committed, w_start if w_start is not None else committed)
            n += max(0, min(end, w_end) - lo)
        out.append((w, n))
    return out


def _pending_lines(total: int, in_windows: list[tuple[dict[str, Any], int]]) -> list[str]:
    if not in_windows:
        return [f"  (the source's WAL has no pending window: all {total} of the lag is offsets "
                "its query has not planned yet)" if total else
                "  (the source's WAL has no pending window)"]
    held = sum(n for _, n in in_windows)
    ids = ", ".join(str(w["window"]) for w, _ in in_windows)
    plural = "s" if len(in_windows) > 1 else ""
    if not held:  # another group's, a multi-cluster WAL, or a lag beyond the window
        return [f"  (window{plural} {ids} of the source's WAL PENDING; none of this lag lies "
                "in them)"]
    lines = [f"  {held} of it: window{plural} {ids} of the source's WAL, PENDING. The source "
             "commits a window's end to the group when Spark plans the batch after it: after "
             "a finished AvailableNow/Once run (as the demo's) the sinks hold the last "
             "window's rows and it shows here as lag until the next run commits it; after a "
             "crash the next run reads it again. See docs/kafka-source.md"]
    if total > held:
        lines.append(f"  the other {total - held}: offsets the query has not planned yet")
    return lines


# -- transactions ------------------------------------------------------------------------------
def transactions(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from connectors.kafka.common import LIBRDKAFKA_LOG
    from connectors.kafka.sink import transactions as txns

    conf: dict[str, Any] = {**kafka_settings(args), "bootstrap.servers": args.bootstrap,
                            "logger": LIBRDKAFKA_LOG}

    def confirm(ids: str) -> bool:
        return args.yes or input(
            f"abort the open transactions of {ids}? A task still writing with one of them "
            "fails and is retried by Spark. Type the sink id to confirm: ").strip() == args.sink_id

    if args.abort and args.writers < 1:
        raise ConnectorError("transactions --abort: give --writers N, the number of writer "
                             "partitions (Spark tasks per batch) of the sink")
    doc: dict[str, Any]
    doc, lines = txns.report(conf, args.topic, args.sink_id, args.writers if args.abort else 0,
                             args.timeout, confirm)
    return doc, lines
