"""What a state directory holds, for the operator's status commands (``eo-connectors wal
show``, ``files status``): which write-ahead logs, the restart a ``sink reset`` recorded, and
why an entry is still pending. Read-only; nothing here writes.

The logs this package writes, each ``<root>/<kind>/<seq:020d>.json|.commit``
(``core/wal.py``):

- ``source``: an ``eo_kafka`` source's windows, under its ``walPath``;
- ``commits``: an ``eo_kafka`` sink's commit markers, under its ``walPath`` (with
  ``sink.json``, ``reset.json`` and the task markers ``started/``);
- ``_eo_log``: an ``eo_files`` sink's rename plans and commits, under its output path (with
  ``_eo_reset.json``).

A directory that holds none of them is an error that says what it does hold: often the
parent of a few ``walPath`` directories (the demo's ``<workdir>/wal``), which are named.
"""

from __future__ import annotations

import posixpath
from datetime import datetime, timezone
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.core.storage import Storage
from connectors.core.wal import COMMIT_EXT, RECORD_EXT, RETAIN_EVERY, SEQ_WIDTH, read_record

#: Log kind -> what it is.
LOGS = {"source": "eo_kafka source windows", "commits": "eo_kafka sink commits",
        "_eo_log": "eo_files batches"}
#: The commit logs of the sinks, which ``--kind sink`` selects.
SINK_LOGS = ("commits", "_eo_log")
#: What ``wal show --kind`` takes: a log kind, or ``sink``.
KINDS = (*LOGS, "sink")
#: Where ``sink reset`` records a restart: the Kafka sink's walPath, the file sink's path.
RESET_FILES = ("reset.json", "_eo_reset.json")

#: Why the newest window of a source log is pending after a run that finished.
SOURCE_PENDING = (
    "the newest window is committed when Spark plans the batch after it (KafkaWindows: when "
    "its block ends): after a finished AvailableNow/Once run it stays PENDING, and shows as "
    "lag, until the next run commits it; after a crash the next run replays it. See "
    "docs/kafka-source.md")
#: Why a file sink batch is pending.
FILES_PENDING = (
    "a PENDING batch has its rename plan but no commit yet: in flight, or its query stopped "
    "between the two; the next run of the query finishes it from the plan. See "
    "docs/file-sink.md")


def open_storage(url: str, storage_args: list[str] | None) -> tuple[Storage, str]:
    """The backend of a command's path argument, with its ``--storage KEY=VALUE`` options
    (object stores; the provider's own environment and credential chain fill in the rest)."""
    from connectors.core.storage import storage_for, storage_options_from

    pairs = {}
    for kv in storage_args or []:
        key, sep, value = kv.partition("=")
        if not sep:
            raise ConnectorError(f"--storage {key!r}: give KEY=VALUE, e.g. endpoint=http://h:9000")
        pairs[key.removeprefix("storage.")] = value
    return storage_for(url, options=storage_options_from(pairs, "eo-connectors"),
                       family="eo-connectors")


def _is_entry(name: str) -> bool:
    for ext in (RECORD_EXT, COMMIT_EXT):
        stem = name[: -len(ext)]
        if name.endswith(ext) and len(stem) == SEQ_WIDTH and stem.isdigit():
            return True
    return False


def is_log(storage: Storage, path: str) -> bool:
    """``path`` is a write-ahead log: it holds WAL entries, or it is an empty directory of a
    log's name."""
    names = storage.list(path)
    if any(_is_entry(n) for n in names):
        return True
    return posixpath.basename(path.rstrip("/")) in LOGS and not names


def _subdirs(storage: Storage, root: str) -> list[str]:
    return [n for n in storage.list(root) if storage.is_dir(storage.join(root, n))]


def find_logs(storage: Storage, root: str) -> tuple[str, list[str]]:
    """``(walPath, kinds)``: the logs in ``root``, or, when ``root`` is a log itself, its
    parent and its name; ``(root, [])`` when there are none."""
    kinds = [n for n in _subdirs(storage, root) if is_log(storage, storage.join(root, n))]
    if kinds:
        return root, kinds
    if is_log(storage, root):
        trimmed = root.rstrip("/")
        return posixpath.dirname(trimmed), [posixpath.basename(trimmed)]
    return root, []


def select(kinds: list[str], wanted: str | None, where: str) -> list[str]:
    """The logs ``--kind`` asks for: one kind, ``sink`` (whichever sink commit log is
    there), or all of them."""
    if not wanted:
        return kinds
    chosen = [k for k in kinds if k in SINK_LOGS] if wanted == "sink" else (
        [wanted] if wanted in kinds else [])
    if not chosen:
        held = ", ".join(f"{k}/ ({LOGS.get(k, 'a log')})" for k in kinds)
        raise ConnectorError(f"wal show: {where} holds no {wanted!r} log; it holds {held}. "
                             "Leave out --kind, or give one of those")
    return chosen


def nothing_here(storage: Storage, root: str, where: str) -> ConnectorError:
    """The error for a directory without logs, naming what it holds instead: walPaths one
    level down (the parent of several), or its entries."""
    inner = []
    for name in _subdirs(storage, root):
        _, kinds = find_logs(storage, storage.join(root, name))
        if kinds:
            inner.append((name, kinds))
    if inner:
        held = ", ".join(f"{posixpath.join(where, n)} ({', '.join(ks)})" for n, ks in inner)
        return ConnectorError(
            f"wal show: {where} holds no write-ahead log itself; it is the parent of "
            f"{len(inner)} walPath(s): {held}. Give one of them, e.g. `eo-connectors wal show "
            f"{posixpath.join(where, inner[0][0])}`")
    names = storage.list(root)
    found = ", ".join(n + ("/" if storage.is_dir(storage.join(root, n)) else "")
                      for n in names[:10]) + (f" and {len(names) - 10} more"
                                              if len(names) > 10 else "")
    return ConnectorError(
        f"wal show: {where} holds no write-ahead log (no source/, commits/ or _eo_log/ with "
        f"WAL entries); it holds {found or 'nothing (empty directory)'}. Give a walPath "
        "(eo_kafka source or sink) or an eo_files output path")


def reset_record(storage: Storage, root: str) -> dict[str, Any] | None:
    """The restart ``sink reset`` recorded under a sink's state directory, if any."""
    for name in RESET_FILES:
        record = read_record(storage, storage.join(root, name), "reset record")
        if record is not None:
            return record
    return None


def reset_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The newest reset of a reset record, for JSON output: ``batch_offset`` (the query's
    batch B is stored as B + offset), ``last_committed`` before it, ``sink_id``, ``at``
    (UTC, ISO 8601) and how many resets the record holds."""
    if not record:
        return None
    resets = record.get("resets") or [{}]
    newest = resets[-1]
    at_ms = newest.get("at_ms")
    at = (datetime.fromtimestamp(at_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")
          if isinstance(at_ms, int) else None)
    return {"batch_offset": int(record.get("batch_offset", 0)),
            "last_committed": newest.get("last_committed"), "sink_id": newest.get("sink_id"),
            "at": at, "resets": len(record.get("resets") or [])}


def reset_line(summary: dict[str, Any] | None) -> str | None:
    """One line on the newest reset: when, by whom, and how batch ids are stored since."""
    if summary is None:
        return None
    offset = summary["batch_offset"]
    count = f" (the newest of {summary['resets']})" if summary["resets"] > 1 else ""
    return (f"reset recorded{count} at {summary['at'] or '?'} for sink "
            f"{summary['sink_id']!r} after batch {summary['last_committed']}: the restarted "
            f"query's batch B is stored as batch B + {offset} (its batch 0 is {offset})")


def pending_note(kind: str, entries: list[dict[str, Any]]) -> str | None:
    """Why the PENDING entries shown are pending, in one line, or None."""
    pending = [e for e in entries if not e["committed"]]
    if not pending:
        return None
    if kind == "source" and pending == entries[-1:]:
        return SOURCE_PENDING
    if kind == "_eo_log":
        return FILES_PENDING
    return None


def kept(kind: str) -> int | None:
    """How many entries the writer of log ``kind`` keeps (``WriteAheadLog.retain``); None
    for a log this package does not write."""
    if kind == "source":
        from connectors.kafka.source.planner import WAL_KEEP_WINDOWS
        return WAL_KEEP_WINDOWS
    if kind == "commits":
        from connectors.kafka.sink.recovery import KEEP_COMMITS
        return KEEP_COMMITS
    if kind == "_eo_log":
        from connectors.files.sink import LOG_RETENTION
        return LOG_RETENTION
    return None


def retention_note(kind: str, seqs: list[int], newest_committed: int | None = None) -> str | None:
    """Why a log begins after 0, in one line, when its retention is the reason: it deletes
    entries only once the log holds more than it keeps, so a log that begins after 0 and
    holds fewer began there (a query whose checkpoint had batches before this sink).

    The rule (``WriteAheadLog.retain``): at every ``RETAIN_EVERY``-th committed seq N, the
    entries before ``N - keep + 1`` go; so the log holds between ``keep`` and
    ``keep + RETAIN_EVERY - 1`` entries, and which ones follows from the last committed."""
    keep = kept(kind)
    if not seqs or seqs[0] == 0 or keep is None or len(seqs) < keep:
        return None
    newest = seqs[-1] if newest_committed is None else newest_committed
    last_run = newest - newest % RETAIN_EVERY
    return (f"entries before {seqs[0]} were removed by retention: this log keeps its newest "
            f"{keep}, deleting older ones at every {RETAIN_EVERY}th commit, so it holds "
            f"{keep} to {keep + RETAIN_EVERY - 1} entries: here {len(seqs)}, {seqs[0]} to "
            f"{seqs[-1]} (the last deletion ran at commit {last_run})")


def commit_summary(info: dict[str, Any] | None, record: dict[str, Any]) -> str:
    """What a commit marker holds, in one line (a sink's commit log keeps its facts of a
    batch there: ``SinkState.record_commit``), or "" for a marker without them (a source
    window's, whose record says it all)."""
    if not info:
        return ""
    figures = {k: v for k, v in info.items() if k != "committed_ms"}
    parts = [f"{k} {v}" for k, v in sorted(figures.items()) if v is not None]
    when = info.get("committed_ms")
    if isinstance(when, int):
        stamp = datetime.fromtimestamp(when / 1000, tz=timezone.utc)
        parts.append("committed " + stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))
    text = ", ".join(parts)
    return f"; commit: {text}" if record and text else text
